"""``fork.py figures``: every result under ``results/``, current or not, and one run that measures them again
(``forkq.figures``)."""
from .. import figures
from .base import Command


class Figures(Command):
    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("check", help="list the results that are not the current series' own, each with the command "
                                     "that measures it again (exit 1 if there is one)")
        run = sub.add_parser("run", help="measure results again, each with its own command, rewrite the pages that "
                                         "quote them, and say how long it took")
        run.add_argument("names", nargs="*", help=f"the results to measure (default: all): "
                                                  f"{', '.join(f.name for f in figures.FIGURES)}")
        run.add_argument("--stale", action="store_true", help="only those that are not current")
        run.add_argument("--every-stop", action="store_true",
                         help="only those cheap enough for every stop that changes a patch")

    def run(self, args):
        if args.action == "check":
            return figures.check()
        return figures.run(args.names or None, only_stale=args.stale, every_stop=args.every_stop)
