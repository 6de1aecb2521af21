"""``fork.py pr-series-266 tree | export | verify`` (``make pr-series``, ``make verify-2.6.6``):
the fixes for Lightning 2.6.6 in ``patches/2.6.6`` (``forkq.series.pr266``)."""
import sys
from pathlib import Path

from .base import Command
from ..series import pr266


class PrSeries266(Command):
    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="cmd", required=True)
        p = sub.add_parser("tree", help="a git repository of the pinned 2.6.6 tree, tagged 2.6.6")
        p.add_argument("--dest", type=Path, default=pr266.TREE_DIR)
        p = sub.add_parser("export", help="git am the series on the pinned tree and copy it, numbered")
        p.add_argument("--out", type=Path, default=pr266.OUT_DIR)
        p = sub.add_parser("verify", help="each patch's tests fail without it and pass with it, on XLA:CPU")
        p.add_argument("--only", help="verify only this patch (file name or number prefix); the others stay recorded")
        p.add_argument("--json", type=Path, default=pr266.VERIFIED_JSON)

    def run(self, args):
        if args.cmd == "tree":
            dest = pr266.base_tree(args.dest.resolve())
            print(f"{dest}: lightning {pr266.TAG} as src/lightning/, tagged {pr266.TAG}")
        elif args.cmd == "export":
            written = pr266.export(args.out.resolve())
            for path in written:
                print(path)
            print(f"{len(written)} patch(es) in {args.out}; git am on lightning {pr266.TAG} verified")
        else:
            record = pr266.verify(args.only, args.json.resolve())
            missing = [p["name"] for p in record["patches"] if not p["flipped"]]
            if missing:
                print(f"{args.prog}: flip missing for {', '.join(missing)} (see {args.json})",
                      file=sys.stderr)
                return 1
            print(f"every verified patch's tests fail without it and pass with it; wrote {args.json}")
        return 0
