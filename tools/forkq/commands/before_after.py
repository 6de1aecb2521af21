"""``fork.py before-after`` (``make before-after``): each 1.8.6 fix's tests fail without
its patch and pass with it (``forkq.series.before_after``)."""
from .base import Command
from ..series.before_after import check


class BeforeAfter(Command):
    error_code = 2

    def add_arguments(self, parser):
        parser.add_argument("--only", help="check only this fix (patch name or number)")
        parser.add_argument("--workers", type=int, default=2)

    def run(self, args):
        return check(args.only, args.workers)
