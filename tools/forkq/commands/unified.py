"""``fork.py unified wheels | tree | compare-upstream`` (``make dist``): the fork as
``lightning-lite`` and as the unified ``lightning`` (``forkq.unified``)."""
from pathlib import Path

from .. import common
from .base import Command


class Unified(Command):
    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="cmd", required=True)
        p = sub.add_parser("wheels", help="build the lightning-lite and lightning wheels from a materialized src")
        p.add_argument("--src", type=Path, default=common.ROOT / "src")
        p.add_argument("--dist", type=Path, default=common.ROOT / "dist")
        p = sub.add_parser("tree", help="write the unified lightning package to DEST/lightning")
        p.add_argument("--src", type=Path, default=common.ROOT / "src")
        p.add_argument("--dest", type=Path, required=True)
        sub.add_parser("compare-upstream", help="check the substitution on upstream's own wheels")

    def run(self, args):
        from .. import unified

        if args.cmd == "wheels":
            for wheel in (unified.build_lite_wheel(args.src, args.dist),
                          unified.build_unified_wheel(args.src, args.dist)):
                print(wheel)
        elif args.cmd == "tree":
            print(unified.build_tree(args.src, args.dest))
        else:
            result = unified.compare_upstream()
            for key, names in result.items():
                print(f"{key}: {len(names)}" + (f"  {names}" if key != "equal" and names else ""))
            return 0 if not result["differ"] and not result["only_upstream"] else 1
        return 0
