"""``fork.py list``: the 1.8.6 series, one patch a line with its kind and subject."""
from .. import common
from .base import Command
from ..patchfile import Patch
from ..seriesfile import read_series


class List(Command):
    def run(self, args):
        for name in read_series():
            patch = Patch.read(common.PATCH_DIR / name)
            print(f"{name}  [{patch.kind or '?'}]  {patch.subject}")
        return 0
