"""``fork.py upstream-tests run | compare`` (``make upstream-tests``, ``tools/upstream_tests.py``): upstream's own 1.8.6
tests on the compat patches alone and on the whole series, compared (``forkq.series.upstream_tests``)."""
import sys
from pathlib import Path

from ..cli import Command
from ..series import upstream_tests as ut


class UpstreamTests(Command):
    error_code = 2

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="cmd", required=True)
        for cmd in ("run", "compare"):
            p = sub.add_parser(cmd)
            p.add_argument("--upstream", type=Path, required=cmd == "run",
                           help=f"git directory of upstream's repository with tag {ut.TAG}, or a tree holding its "
                                "tests/")
            p.add_argument("--build", type=Path, default=ut.BUILD)
            p.add_argument("--out", type=Path, default=ut.RESULT)
            p.add_argument("--dirs", nargs="+", default=list(ut.DIRS), help="folders under upstream's tests/")
        run = sub.choices["run"]
        run.add_argument("--trees", nargs="+", default=list(ut.TREES), choices=ut.TREES,
                         help="run only these trees again")
        run.add_argument("--test-timeout", type=float, default=600.0, help="seconds; a test running longer fails")
        run.add_argument("--timeout", type=float, default=6 * 3600.0, help="seconds for each tree's whole run")
        run.add_argument("--parallel", action="store_true", help="run both trees at once (two pytest processes)")
        run.add_argument("--reruns", type=int, default=2, help="run the differing tests this many more times per tree")
        run.add_argument("--workers", type=int, default=0, help="pytest-xdist workers per tree (0: none)")
        for p in sub.choices.values():
            p.add_argument("--xla", action="store_true",
                           help="on one XLA device: the Trainer through upstream's PL_TRAINER_* defaults, LightningLite "
                                "through the fork's plugin (default folders, build and result change with it)")

    def run(self, args):
        if args.xla:  # the XLA run's own defaults, where the caller kept the CPU run's
            args.build = ut.BUILD_XLA if args.build == ut.BUILD else args.build
            args.out = ut.RESULT_XLA if args.out == ut.RESULT else args.out
            args.dirs = list(ut.XLA_DIRS) if args.dirs == list(ut.DIRS) else args.dirs
        if args.cmd == "compare":
            result = ut.compare_last(args.build, args.dirs, args.out, args.upstream)
            print(ut.summary(result))
            return 0 if not result["unexplained"] else 1

        def log(message: str) -> None:
            print(f"{args.prog}: {message}", file=sys.stderr, flush=True)

        result = ut.run(args.upstream, args.dirs, args.build, args.out, args.trees, args.test_timeout, args.timeout,
                        args.parallel, args.reruns, log=log, xla=args.xla, workers=args.workers)
        print(ut.summary(result))
        print(f"wrote {args.out}")
        return 0 if not result["unexplained"] else 1
