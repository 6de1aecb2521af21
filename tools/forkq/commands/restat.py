"""``fork.py restat NAME`` (``make restat``): redraw a patch's diffstat from its diff, after sections under ``tests/``
were added to it by hand."""
from ..authoring import restat
from .refresh import Refresh


class Restat(Refresh):
    action = staticmethod(restat)
