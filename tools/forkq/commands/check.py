"""``fork.py check`` (``make check-series``): both queues follow the header rules and apply, the series files and the
generated blocks of the README and docs/patches.md are current, and no doc or test names a patch file that does not
exist (``forkq.authoring.check``)."""
from ..authoring import check
from .base import Command


class Check(Command):
    def run(self, args):
        return check()
