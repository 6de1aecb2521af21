"""``fork.py upstream-tests run | compare | check | edits`` (``make upstream-tests``, ``make upstream-tests-xla``,
``make upstream-test-edits``): upstream's own 1.8.6 tests on the compat patches alone and on the whole series,
compared, on the CPU or on one XLA device (``forkq.series.upstream_tests``); and each edit the series makes to them,
run with and without it (``forkq.series.test_edits``)."""
import sys
from pathlib import Path

from .base import Command
from ..common import ForkError
from ..series import both_fail, test_edits, upstream_tests as ut


class UpstreamTests(Command):
    error_code = 2

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="cmd", required=True)
        for cmd in ("run", "compare", "check"):
            p = sub.add_parser(cmd)
            p.add_argument("--upstream", type=Path, required=cmd != "compare",
                           help=f"git directory of upstream's repository with tag {ut.TAG}, or a tree holding its "
                                "tests/")
            p.add_argument("--build", type=Path, default=None, help=f"default {ut.BUILD} ({ut.BUILD_XLA} on XLA)")
            p.add_argument("--out", type=Path, default=None, help=f"default {ut.RESULT} ({ut.RESULT_XLA} on XLA)")
            p.add_argument("--test-timeout", type=float, default=600.0, help="seconds; a test running longer fails")
            p.add_argument("--timeout", type=float, default=6 * 3600.0, help="seconds for each tree's whole run")
            p.add_argument("--workers", type=int, default=0, help="pytest-xdist workers per tree (0: none)")
            p.add_argument("--reruns", type=int, default=2, help="run the differing tests this many more times")
            if cmd != "check":
                p.add_argument("--dirs", nargs="+", default=None,
                               help=f"folders under upstream's tests/ (default {' '.join(ut.DIRS)}; on XLA "
                                    f"{' '.join(ut.XLA_DIRS)})")
                p.add_argument("--xla", action="store_true",
                               help="on one XLA device: the Trainer through upstream's PL_TRAINER_* defaults, "
                                    "LightningLite through the fork's plugin")
            p.add_argument("--baseline", type=Path, default=ut.BASELINE_XLA,
                           help="on XLA, the compat tree's committed outcomes: written by `run --xla` when it runs "
                                "the compat tree, read by `check`")
        edits = sub.add_parser("edits", help="each edit of upstream's tests: its tests fail on the series without "
                                             "it and pass with it")
        edits.add_argument("--upstream", type=Path, required=True,
                           help=f"git directory of upstream's repository with tag {ut.TAG}, or a tree holding its tests/")
        edits.add_argument("--build", type=Path, default=test_edits.BUILD)
        edits.add_argument("--out", type=Path, default=test_edits.RESULT)
        edits.add_argument("--modes", nargs="+", choices=test_edits.MODES, default=list(test_edits.MODES))
        edits.add_argument("--test-timeout", type=float, default=300.0, help="seconds; a test running longer fails")
        edits.add_argument("--timeout", type=float, default=3600.0, help="seconds for each pytest run")
        edits.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (0: none)")
        run = sub.choices["run"]
        run.add_argument("--trees", nargs="+", default=list(ut.TREES), choices=ut.TREES,
                         help="run only these trees again")
        run.add_argument("--parallel", action="store_true", help="run both trees at once (two pytest processes)")
        run.add_argument("--compat-scope", choices=ut.COMPAT_SCOPES, default=None,
                         help="on XLA, the compat tree runs the tests the series does not pass (not-passed, the "
                              "default there: its whole run takes hours) or all of them")

    def run(self, args):
        def log(message: str) -> None:
            print(f"{args.prog}: {message}", file=sys.stderr, flush=True)

        if args.cmd == "edits":
            try:
                result = test_edits.check(args.upstream, args.modes, args.build.resolve(), args.out,
                                          args.test_timeout, args.timeout, args.workers, log=log)
            except ForkError as err:
                print(f"{args.prog}: {err}", file=sys.stderr)
                return 2
            print(test_edits.summary(result))
            print(f"wrote {args.out}")
            problems = test_edits.problems(result)
            for problem in problems:
                print(f"{args.prog}: {problem}", file=sys.stderr)
            return 1 if problems else 0
        xla = args.cmd == "check" or args.xla
        build = args.build or (ut.BUILD_XLA if xla else ut.BUILD)
        out = args.out or (ut.RESULT_XLA if xla else ut.RESULT)
        if args.cmd == "check":
            try:
                result = ut.check(args.upstream, args.baseline, build, out, args.test_timeout, args.timeout,
                                  args.reruns, args.workers, log=log)
            except ForkError as err:
                print(f"{args.prog}: {err}", file=sys.stderr)
                return 2
            print(ut.summary(result))
            print(f"wrote {out}")
            sys.stdout.flush()
            failed = self._both_fail_problem(args.prog, result) | self._aborted(args.prog, result)
            if result["unexplained"]:
                print(f"{args.prog}: {len(result['unexplained'])} of upstream's tests on XLA differ from the compat "
                      f"baseline ({args.baseline.name}) and are neither updated on purpose nor flaky: fix them, or "
                      f"if the compat side changed (a new compat patch, a new torch), write the baseline again with "
                      f"`{ut.REFRESH_XLA}`", file=sys.stderr)
                return 1
            return 1 if failed else 0
        dirs = args.dirs or list(ut.XLA_DIRS if xla else ut.DIRS)
        if args.cmd == "compare":
            result = ut.compare_last(build, dirs, out, args.upstream, xla)
            print(ut.summary(result))
            return self._verdict(args.prog, result)
        result = ut.run(args.upstream, dirs, build, out, args.trees, args.test_timeout, args.timeout,
                        args.parallel, args.reruns, log=log, xla=xla, workers=args.workers,
                        baseline=args.baseline if xla else None,
                        compat_scope=args.compat_scope or ("not-passed" if xla else "all"))
        print(ut.summary(result))
        print(f"wrote {out}")
        return self._verdict(args.prog, result)

    def _verdict(self, prog: str, result) -> int:
        """1 when the comparison fails, with every reason said last (a CI log keeps its end), else 0."""
        sys.stdout.flush()
        reasons = []
        if self._both_fail_problem(prog, result):
            reasons.append("tests failing on both trees without a reviewed reason")
        if self._aborted(prog, result):
            reasons.append("a tree's run ended early")
        unexplained = result["unexplained"]
        if unexplained:
            print(f"{prog}: {len(unexplained)} of upstream's tests differ between the compat tree and the series and "
                  f"are neither updated on purpose, improved nor flaky: " + ", ".join(unexplained[:20]),
                  file=sys.stderr)
            reasons.append(f"{len(unexplained)} unexplained differences")
        if reasons:
            print(f"{prog}: the comparison failed: {'; '.join(reasons)}", file=sys.stderr)
            return 1
        return 0

    @staticmethod
    def _aborted(prog: str, result) -> bool:
        """Say so and return True when pytest ended a tree's run early (``forkq.series.upstream_tests.aborted``)."""
        trees = [tree for tree, info in result.get("trees", {}).items() if info.get("aborted")]
        for tree in trees:
            print(f"{prog}: pytest ended the {tree} tree's run early (an internal error or an interruption): the tests "
                  f"it did not reach are missing from the comparison; its log says why", file=sys.stderr)
        return bool(trees)

    @staticmethod
    def _both_fail_problem(prog: str, result) -> bool:
        """Say so and return True when a test fails on both trees without a reviewed reason, or because upstream's
        test is written for an older pytest or torchmetrics (``forkq.series.both_fail``)."""
        tests = result.get("both_fail", {}).get("tests", {})
        bad = {t: c for t, c in tests.items() if c == both_fail.UNLISTED or c in both_fail.STALE_TEST_API}
        if not bad:
            return False
        print(f"{prog}: {len(bad)} of upstream's tests fail on both trees without a reviewed reason: port them (a "
              f"test written for an older pytest or torchmetrics), fix them, or name them with their reason in "
              f"{both_fail.LIST.relative_to(both_fail.LIST.parents[3])}: "
              + ", ".join(f"{t} ({c})" for t, c in sorted(bad.items())[:20]), file=sys.stderr)
        return True
