"""``fork.py new NAME ...`` (``make new-patch``): the edits in ``src/`` as a new patch at the end of the series."""
from pathlib import Path

from ..authoring import new_patch
from .base import Command
from ..common import KINDS


class New(Command):
    def add_arguments(self, parser):
        parser.add_argument("name", help="the new patch's file name, NNNN-short-description.patch")
        parser.add_argument("--subject", required=True)
        parser.add_argument("--body-file", type=Path, required=True)
        parser.add_argument("--kind", required=True, choices=KINDS)
        parser.add_argument("--bug", default=None,
                            help="the upstream issue: one https:// URL (leave out when there is none)")
        parser.add_argument("--forwarded", required=True,
                            help="`no`, `not-needed`, or the URL of the upstream pull request")
        parser.add_argument("--origin", default="vendor",
                            help="`vendor` (written by the fork; the default) or `<upstream|backport|other>, <URL>`")
        parser.add_argument("--applied-upstream", default=None, help="a backport's `<version>, <URL>`")

    def run(self, args):
        new_patch(args.name, args.subject, args.body_file.read_text(), args.kind, args.bug or None, args.forwarded,
                  args.origin, applied_upstream=args.applied_upstream or None)
        return 0
