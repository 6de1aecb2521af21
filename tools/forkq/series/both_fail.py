"""Upstream's tests that fail on both trees, by cause: the reviewed list ``both_fail.txt`` and the causes that no
listing can excuse.

A test that fails (or errors) on the compat tree and on the series compares as "same", so it guards nothing: the
series could break it differently without notice. Each such test must therefore have a reason that a reviewer
accepted, in ``both_fail.txt`` next to this module::

    [package] hydra-core is not installed
    tests/tests_pytorch/models/test_hparams.py::test_model_save_hyper_parameters_interpolation_with_hydra

A line ``[<cause>] <reason>`` opens a group; each following line is a pattern over a test's pytest node id (or over
its module's path for a module that failed to load) in which ``*`` stands for any text and every other character for
itself (brackets too: parametrized ids hold them), optionally followed by ``@cpu`` or ``@xla`` when the reason holds
on that accelerator only. A test takes the first group that matches it. The causes are
:data:`CAUSES`.

Some failures say by their message that upstream's test, not Lightning, is out of date with today's stack
(:data:`STALE_TEST_API`: ``pytest.warns(None)``, a torchmetrics metric without ``task=``). Those are counted under
their own cause whatever the list says: the compat patches port such tests, and a count above zero there is work
left, not a reason.
"""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Dict, List, Optional, Sequence, Tuple

from ..common import ForkError

LIST = Path(__file__).resolve().parent / "both_fail.txt"
CAUSES = {
    "hardware": "needs hardware this host lacks (a GPU, a TPU chip, several XLA devices that talk)",
    "package": "needs a package that is not installed",
    "network": "needs files that upstream's CI downloads (legacy checkpoints, MNIST), which this host cannot fetch",
    "fork": "tests 1.8.6 behaviour that a compat patch replaces on purpose",
    "torch": "1.8.6 code against an API that today's torch changed, not ported",
    "lightning": "a 1.8.6 bug on today's stack, on both trees",
    "xla": "cannot run on one XLA device, or tests what XLA does differently",
}
# failures whose message shows an upstream test written for an older pytest or torchmetrics: never excused
STALE_TEST_API = {
    "pytest": (r"exceptions must be derived from Warning", r"pytest\.warns\(None\)"),
    "torchmetrics": (r"missing 1 required positional argument: 'task'",
                     r"unexpected keyword argument 'compute_on_step'"),
}
UNLISTED = "unlisted"
# a test that failed on both trees in the first run and passed on the series when its module ran again: no reviewed
# reason, but no steady failure either (upstream's multi-process tests abort now and then in gloo's teardown here)
FLAKY = "flaky"
FLAKY_REASON = "failed on both trees in the first run, passed on the series when its module ran again"
# the outcomes of a test that did not pass (``forkq.series.upstream_tests.read_outcomes``): a timeout and a crash are
# outcomes of their own, and a test that times out or crashes on both trees needs a reviewed reason like a failure
FAILING = ("failed", "error", "timeout", "crashed")


@dataclass(frozen=True)
class Group:
    cause: str
    reason: str
    patterns: Tuple[Tuple[str, Optional[str]], ...]  # (pattern, accelerator or None)


def read_list(path: Path = LIST) -> List[Group]:
    """The groups of the reviewed list, in order; an unknown cause, a group without a reason or a pattern outside a
    group is an error naming the line."""
    groups: List[Group] = []
    cause, reason, patterns = None, "", []

    def close() -> None:
        if cause is not None:
            groups.append(Group(cause, reason, tuple(patterns)))

    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        header = re.fullmatch(r"\[([a-z-]+)\]\s*(.*)", line)
        if header:
            close()
            cause, reason, patterns = header.group(1), header.group(2).strip(), []
            if cause not in CAUSES:
                raise ForkError(f"{path}:{number}: unknown cause {cause!r}; one of {', '.join(CAUSES)}")
            if not reason:
                raise ForkError(f"{path}:{number}: the group [{cause}] gives no reason")
            continue
        if cause is None:
            raise ForkError(f"{path}:{number}: a test pattern before any [cause] line")
        pattern, _, where = line.partition(" @")
        if where and where not in ("cpu", "xla"):
            raise ForkError(f"{path}:{number}: `@{where}`: a pattern may end with @cpu or @xla only")
        patterns.append((pattern.strip(), where or None))
    close()
    return groups


def matches(node: str, pattern: str) -> bool:
    """Whether pytest's node id ``node`` matches ``pattern``: ``*`` is any text, everything else is literal."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), node) is not None


def stale_api(message: str) -> Optional[str]:
    """The cause of :data:`STALE_TEST_API` that ``message`` shows, if any."""
    for cause, expressions in STALE_TEST_API.items():
        if any(re.search(e, message or "") for e in expressions):
            return cause
    return None


def classify(tests: Dict[str, Dict[str, str]], groups: Sequence[Group], accelerator: str,
             passed_again: Collection[str] = ()) -> Dict[str, Dict[str, str]]:
    """``{test: {"cause", "reason"}}`` for ``tests`` (``{test id: {"node", "message"}}``): the stale-API cause
    its message shows, else the first group matching its node id on ``accelerator``, else :data:`FLAKY` for one of
    ``passed_again`` (the tests that passed on the series in a rerun), else :data:`UNLISTED`."""
    out = {}
    for key, entry in tests.items():
        stale = stale_api(entry.get("message", ""))
        if stale:
            out[key] = {"cause": stale, "reason": f"upstream's test is written for an older {stale}"}
            continue
        node = entry["node"]
        found = next((g for g in groups for pattern, where in g.patterns
                      if (where is None or where == accelerator) and matches(node, pattern)), None)
        if found:
            out[key] = {"cause": found.cause, "reason": found.reason}
        elif key in passed_again:
            out[key] = {"cause": FLAKY, "reason": FLAKY_REASON}
        else:
            out[key] = {"cause": UNLISTED, "reason": ""}
    return out


def by_cause(classified: Dict[str, Dict[str, str]]) -> Dict[str, int]:
    """The number of tests of each cause, in :data:`CAUSES` order, the stale-API causes and the unlisted last."""
    order = list(CAUSES) + list(STALE_TEST_API) + [FLAKY, UNLISTED]
    found = [c["cause"] for c in classified.values()]
    return {cause: found.count(cause) for cause in order if cause in found}

