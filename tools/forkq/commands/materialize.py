"""``fork.py materialize``: upstream 1.8.6 plus the series (or a prefix of it) in ``src/`` (``forkq.tree``)."""
from pathlib import Path

from .. import common
from .base import Command
from ..tree import materialize


class Materialize(Command):
    interrupted_note = "nothing half-written was left behind"

    def add_arguments(self, parser):
        parser.add_argument("--upto", default=None, help="last patch to apply (name or number); 'upstream' for none")
        parser.add_argument("--dest", type=Path, default=common.ROOT / "src")
        parser.add_argument("--force", action="store_true", help="rebuild even when up to date, discarding local edits")
        parser.add_argument("--cache-dir", type=Path, default=common.CACHE_DIR,
                            help="where the pinned upstream wheel is kept")

    def run(self, args):
        materialize(args.dest, args.upto, args.force, cache_dir=args.cache_dir)
        return 0
