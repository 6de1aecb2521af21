"""``fork.py readme [--check]``: the README's version example and count of the patches by kind, and the table of the
patches in docs/patches.md."""
from ..authoring import readme
from .base import Command


class Readme(Command):
    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="only check them (exit 1 when they are stale)")

    def run(self, args):
        return readme(args.check)
