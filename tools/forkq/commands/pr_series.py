"""``fork.py pr-series export | check-tag`` (``make pr-series``): the 1.8.6 fixes as a
``git am`` series for upstream's tag 1.8.6 and ``docs/upstream-prs.md`` (``forkq.series.pr186``)."""
import json
from pathlib import Path

from .. import common
from .base import Command


class PrSeries(Command):
    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="cmd", required=True)
        p = sub.add_parser("export", help="write the PR series and its document")
        p.add_argument("--out", type=Path, default=common.ROOT / "build" / "pr-series")
        p.add_argument("--doc", type=Path, default=common.ROOT / "docs" / "upstream-prs.md")
        p = sub.add_parser("check-tag",
                           help="git am the series onto upstream's tag 1.8.6; collect and run its tests there")
        p.add_argument("--upstream-git", type=Path, required=True,
                       help="a clone of upstream's repository with tag 1.8.6")
        p.add_argument("--series", type=Path, default=common.ROOT / "build" / "pr-series")
        p.add_argument("--no-run", action="store_true", help="only collect the tests")

    def run(self, args):
        if args.cmd == "check-tag":
            from ..series.pr186.check_tag import check_tag

            result = check_tag(args.upstream_git, args.series, run=not args.no_run)
            print(json.dumps({k: v for k, v in result.items() if not k.endswith("_output")}, indent=1))
            return 0 if result["collect_ok"] and result.get("run_ok", True) else 1
        from ..series.pr186.export import export

        mboxes = export(args.out, args.doc)
        for m in mboxes:
            print(m)
        print(f"{len(mboxes)} PR patch(es) in {args.out}; git am on upstream 1.8.6 verified; wrote {args.doc}")
        return 0
