"""``fork.py readme [--check]``: the README's version example and its table of the changes."""
from ..authoring import readme
from .base import Command


class Readme(Command):
    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true", help="only check them (exit 1 when they are stale)")

    def run(self, args):
        return readme(args.check)
