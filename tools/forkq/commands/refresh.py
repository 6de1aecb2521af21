"""``fork.py refresh NAME`` (``make refresh``): rewrite a patch from the edits in ``src/``."""
from ..authoring import refresh
from .base import Command


class Refresh(Command):
    #: what is done to the patch that NAME names
    action = staticmethod(refresh)

    def add_arguments(self, parser):
        parser.add_argument("name", help="the patch: its file name or number")

    def run(self, args):
        self.action(args.name)
        return 0
