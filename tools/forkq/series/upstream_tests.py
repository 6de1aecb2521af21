#!/usr/bin/env python3
"""Run upstream's own 1.8.6 tests on the compatibility patches alone and on the whole series; compare the outcomes.

The fork must not change what upstream's tests see, except where a patch changes a behaviour on purpose, and then
that patch updates upstream's test of it (its ``tests/`` sections, see ``forkq.patchfile.split_diff``). This
tool checks exactly that. It writes two trees under ``--build`` (default ``build/upstream-tests``):

- ``compat``: upstream 1.8.6 plus every ``Kind: compat`` patch of ``patches/1.8.6/series``, in series order (but one
  whose every line is a line the fixes add): the tag's code running on this machine's torch, torch_xla and NumPy, and
  nothing else;
- ``series``: upstream 1.8.6 plus the whole series.

Each tree gets its own copy of the tag's ``tests/`` and ``setup.cfg`` (upstream's pytest configuration), with the
``tests/`` sections of the patches in that tree applied. The tests of ``--dirs`` run on both trees with
``PJRT_DEVICE`` unset (the CPU accelerator), each test stopped after ``--test-timeout`` seconds (pytest-timeout) and
each tree's run after ``--timeout``. The per-test outcomes (JUnit XML) are compared; the tests that differ run
``--reruns`` more times on each tree, and one that gives a same outcome on both trees in some run is flaky, not a
difference. The differences, and the tests the series updates on purpose, go to
``results/upstream-tests-1.8.6.json``. A test erroring identically on both trees (a package upstream's tests want that
is not installed) counts as the same result, and needs a reason in the reviewed list (``both_fail.txt``); one the list
does not name runs again with the differences, and passing on the series there makes it flaky, not unlisted.

The tag's tests come from ``--upstream``: a git directory of upstream's repository holding tag ``1.8.6`` (bare or
not; e.g. a clone of https://github.com/Lightning-AI/lightning), or an extracted tree holding the tag's ``tests/``
(and ``setup.cfg``). Nothing is downloaded except the pinned upstream wheel that materialize uses. Exit code 0 when
the only differences are flaky tests and tests the series updates on purpose, which pass.

Commands (``python3 tools/fork.py upstream-tests ...``)::

    run --upstream PATH [--dirs D ...] [--build DIR] [--out FILE] [--parallel]
    compare --upstream PATH --build DIR [--out FILE]   (the trees' last runs, compared again)
"""
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Collection, Dict, List, Optional, Sequence, Set

from .. import common, stamp
from ..common import ForkError, git
from ..patchfile import Patch, file_sections, split_diff
from ..seriesfile import read_series
from ..tree import apply_patch, materialize, tree_version
from ..upstream import TAG, TAG_TEST_FILES, fetch_wheel, read_lock, unpack_packages, unpack_tag
from . import both_fail, engine
from .pr186.testmodules import updated_tests

# on the CPU: every folder of upstream's tests, but the modules of LEFT_OUT
DIRS = ("tests_pytorch", "tests_lite")
# modules (and single tests) no run takes, each with why; pytest is told to ignore them (``--ignore``,
# ``--deselect``), and the results name them
_DDP_WAITS = ("its tests start DDP process groups of two CPU processes; under pytest-xdist on this host the module "
              "never finished (a rank waiting for its peer); nothing in them reaches code the patches change")
_RENDEZVOUS = ("its tests build a DDP strategy of two ranks in one process and wait for the second in c10d's TCPStore "
               "rendezvous, a C++ loop that pytest-timeout's signal does not interrupt: the test hangs its worker for "
               "good; nothing in them reaches code the patches change")
LEFT_OUT = {
    "tests_pytorch/strategies/test_ddp.py": _RENDEZVOUS,
    "tests_pytorch/strategies/test_ddp_spawn.py": _DDP_WAITS,
    "tests_pytorch/strategies/test_ddp_spawn_strategy.py": _DDP_WAITS,
    "tests_pytorch/strategies/test_ddp_strategy.py": _DDP_WAITS,
    "tests_pytorch/strategies/test_ddp_strategy_with_comm_hook.py": _DDP_WAITS,
    "tests_pytorch/strategies/test_ddp_fully_sharded_native.py": _DDP_WAITS,
    "tests_pytorch/strategies/test_ddp_fully_sharded_with_full_state_dict.py": _DDP_WAITS,
    "tests_pytorch/utilities/test_auto_restart.py::test_dataset_rng_states_restart_with_lightning"
    "[max_size_cycle-dataset_classes3]": "a fault-tolerant restart with two dataloaders of workers that waits for "
    "good: it reached the 600-second limit on the CPU (compat tree) and the 300-second one on XLA:CPU (series), and "
    "killed a pytest-xdist worker on XLA (compat tree); its siblings run",
}
TREES = ("compat", "series")
BUILD = common.ROOT / "build" / "upstream-tests"
RESULT = common.ROOT / "results" / f"upstream-tests-{TAG}.json"
# on XLA (``--xla``): the same, on one XLA:CPU device
XLA_DIRS = DIRS
BUILD_XLA = common.ROOT / "build" / "upstream-tests-xla"
RESULT_XLA = common.ROOT / "results" / f"upstream-tests-xla-{TAG}.json"
# the compat tree's outcomes on XLA, committed: CI runs only the series and compares it with these
BASELINE_XLA = common.ROOT / "results" / f"upstream-tests-xla-{TAG}-compat.json"
# the command that runs both trees on XLA and writes that baseline again
REFRESH_XLA = "make upstream-tests-xla UPSTREAM=<a clone of Lightning-AI/lightning>"
# the plugin that puts LightningLite on XLA (the Trainer needs none: upstream reads PL_TRAINER_* itself)
XLA_PLUGIN_DIR = Path(__file__).resolve().parent / "xla_defaults"
XLA_PLUGIN = "fork_upstream_xla"
# the plugin (same folder) that declares the markers of test plugins not installed here, on the CPU and on XLA
MARKERS_PLUGIN = "fork_upstream_markers"
# ``torch.load`` as upstream 1.8.6 met it (torch < 2.6 unpickled everything) wherever the caller does not choose: on
# the compat tree only, whose outcomes stand for upstream's side, a test's own ``torch.load(path)`` reads as in 2022.
# The series runs as users run it, with torch's default (weights only): a test that reads what the series wrote with
# a plain ``torch.load`` and fails there is a difference. Lightning's own loading names ``weights_only=True`` on both
# trees, which the variable does not override.
TORCH_LOAD_AS_IN_2022 = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
#: the tree that gets ``TORCH_LOAD_AS_IN_2022`` on XLA
TORCH_LOAD_AS_IN_2022_TREE = "compat"
# what torch's safe unpickler says when it refuses a file: a difference whose series failure says it is run again on
# the compat tree under torch's own default, the run named ``TORCH_DEFAULT_RUN``; if upstream's side fails it there the
# same way, the test's own ``torch.load`` meets torch's default, not the fork (``torch_default`` in the results)
TORCH_REFUSED = "Weights only load failed"
TORCH_DEFAULT_RUN = "torch-default"
# the plugin's variable naming a file of the tests to keep (JUnit keys, or ``file:<path>``)
ONLY_ENV = "FORK_UPSTREAM_ONLY"
# on XLA: one XLA:CPU device (a TPU's where PJRT_DEVICE says TPU), for the Trainer and for LightningLite
XLA_ENV = {"PL_TRAINER_ACCELERATOR": "tpu", "PL_TRAINER_DEVICES": "1", "PL_LITE_ACCELERATOR": "tpu",
           "PL_LITE_DEVICES": "1"}
# environment variables that would select an XLA device or change what the tests see
# the compat tree on XLA runs only the tests the series does not pass (``--compat-scope not-passed``): a test the
# series passes cannot be one that passes on compat and fails on the series, and the compat tree is slow there (its
# graphs grow every step: its whole run takes hours). The others stand in the results as NOT_RUN.
COMPAT_SCOPES = ("not-passed", "all")
NOT_RUN = "not run (passed on the series)"
SCOPE_FILE = "scope.json"
UNSET = ("PJRT_DEVICE", "XLA_USE_BF16", "XLA_DOWNCAST_BF16", "CPU_NUM_DEVICES", "TPU_NUM_DEVICES",
         "PL_FAULT_TOLERANT_TRAINING", "PL_RUN_STANDALONE_TESTS", "TORCH_FORCE_WEIGHTS_ONLY_LOAD",
         "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


# --------------------------------------------------------------------------------------------- upstream's tests
def extract_tests(upstream: Path, dest: Path) -> str:
    """Write the tag's ``tests/`` and ``setup.cfg`` to ``dest``; return how they were found."""
    upstream = upstream.resolve()
    dest.mkdir(parents=True, exist_ok=True)
    git_dir = unpack_tag(upstream, dest, TAG_TEST_FILES)
    if git_dir is not None:
        return f"git archive {TAG} of {git_dir.name}"
    if (upstream / "tests" / "tests_pytorch").is_dir():
        root = upstream
    elif (upstream / "tests_pytorch").is_dir():
        root = upstream.parent  # the tests folder itself; setup.cfg is next to it, if anywhere
        if upstream.name != "tests":
            raise ForkError(f"{upstream} holds tests_pytorch/ but is not named tests/: pass its parent folder")
    else:
        raise ForkError(f"{upstream} is neither a git directory with tag {TAG} nor a tree holding upstream's "
                        f"tests/tests_pytorch: fetch upstream (a clone of Lightning-AI/lightning) and pass its .git")
    shutil.copytree(root / "tests", dest / "tests")
    if (root / "setup.cfg").exists():
        shutil.copy2(root / "setup.cfg", dest / "setup.cfg")
    else:
        print(f"fork.py upstream-tests: warning: no setup.cfg next to {root / 'tests'}; the tests run without "
              "upstream's pytest configuration", file=sys.stderr)
    return f"copy of {root / 'tests'}"


def tree_patches(tree: str, patch_dir: Path = common.PATCH_DIR) -> "tuple[List[str], Dict[str, str]]":
    """The patches of a tree, and the compat patches left out of it with the reason.

    ``series`` is the whole series. ``compat`` is every compat patch, in series order: the compat tree is the whole
    compat port. A compat patch that does not apply there is left out only when no hunk of it applies on its own,
    that is when every line it changes is one the fix patches add (the result names it); a patch that mixes such
    lines with lines of upstream's raises :class:`ForkError`, naming the hunks to move into a compat patch before the
    fixes.
    """
    series = read_series(patch_dir / "series")
    if tree == "series":
        return series, {}
    compats = [n for n in series if Patch.read(patch_dir / n).kind == "compat"]
    applied: List[str] = []
    left_out: Dict[str, str] = {}
    lock = read_lock()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        wheel = fetch_wheel("pytorch-lightning", lock["pytorch-lightning"])
        unpack_packages(wheel, root / "src")
        for name in compats:
            try:
                apply_patch(root, patch_dir / name)
            except ForkError:
                fitting = applying_hunks(root, Patch.read(patch_dir / name).diff)
                if fitting:
                    raise ForkError(
                        f"compat patch {name} does not apply to the compat tree, but some of its hunks do: "
                        + ", ".join(fitting) + ". The compat tree must hold the whole compat port: move those hunks "
                        "into a compat patch before the fixes, and keep in this one only lines the fixes add")
                left_out[name] = "every line it changes is one the fix patches add; it follows them in the series"
                continue
            applied.append(name)
    return applied, left_out


def hunks(diff: str) -> List["tuple[str, str]"]:
    """``[(where, one-hunk diff)]`` of the ``src/`` sections of ``diff``: each hunk with its section's header, so
    that it applies (or not) on its own; ``where`` is ``<path>:<line>``."""
    out = []
    for path, section in file_sections(split_diff(diff)[0]):
        head, *parts = re.split(r"(?m)^(?=@@ )", section)
        for part in parts:
            line = re.match(r"@@ -(\d+)", part)
            out.append((f"{path}:{line.group(1) if line else '?'}", head + part))
    return out


def applying_hunks(root: Path, diff: str) -> List[str]:
    """Where the hunks of ``diff`` that ``git apply --check`` takes on ``root`` on their own are (nothing is
    applied)."""
    fitting = []
    for where, one in hunks(diff):
        proc = git(["apply", "--check", "--whitespace=nowarn", "-"], cwd=root, check=False, input=one)
        if proc.returncode == 0:
            fitting.append(where)
    return fitting


def updated_by(names: Sequence[str], patch_dir: Path = common.PATCH_DIR) -> Dict[str, Dict[str, List[str]]]:
    """``{upstream test file: {test function: [patches updating it]}}`` for the ``tests/`` sections of ``names``."""
    found: Dict[str, Dict[str, List[str]]] = {}
    for name in names:
        tests_diff = Patch.read(patch_dir / name).tests_diff
        for path, functions in updated_tests(tests_diff).items():
            for function in functions or ["*"]:
                found.setdefault(path, {}).setdefault(function, []).append(name)
    return found


def apply_test_updates(tree: Path, names: Sequence[str], patch_dir: Path = common.PATCH_DIR) -> None:
    """Apply the ``tests/`` sections of ``names`` to the tag's tests in ``tree`` (no fuzz)."""
    for name in names:
        tests_diff = Patch.read(patch_dir / name).tests_diff
        if not tests_diff:
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".patch", delete=False) as f:
            f.write(tests_diff)
        try:
            proc = git(["apply", "--whitespace=nowarn", str(f.name)], cwd=tree, check=False)
        finally:
            os.unlink(f.name)
        if proc.returncode != 0:
            raise ForkError(f"the tests/ sections of {name} do not apply to upstream's tests of tag {TAG}:\n"
                            f"{proc.stderr}")


def build_tree(tree: str, tests_root: Path, build: Path, patch_dir: Path = common.PATCH_DIR) -> Path:
    """``build/<tree>``: ``src/`` materialized for the tree's patches, the tag's tests with their updates."""
    names, left_out = tree_patches(tree, patch_dir)
    dest = build / tree
    dest.mkdir(parents=True, exist_ok=True)
    if tree == "series":
        queue = patch_dir
    else:
        queue = build / f"queue-{tree}"
        shutil.rmtree(queue, ignore_errors=True)
        queue.mkdir(parents=True)
        for name in names:
            shutil.copy2(patch_dir / name, queue / name)
        (queue / "series").write_text("".join(n + "\n" for n in names))
    materialize(dest / "src", patch_dir=queue, quiet=True, force=True)
    for name in TAG_TEST_FILES:
        target = dest / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        if (tests_root / name).is_dir():
            shutil.copytree(tests_root / name, target)
        elif (tests_root / name).exists():
            shutil.copy2(tests_root / name, target)
    apply_test_updates(dest, names, patch_dir)
    (dest / "patches.json").write_text(json.dumps({"patches": names, "left_out": left_out}, indent=1) + "\n")
    return dest


# --------------------------------------------------------------------------------------------- running
def _env(tree: Path, xla: bool = False, only: Optional[Path] = None, torch_default: bool = False) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET and not k.startswith(("PL_TRAINER_", "PL_LITE_"))}
    env.pop(ONLY_ENV, None)
    if only is not None:
        env[ONLY_ENV] = str(only)
    env["PYTHONPATH"] = engine.pythonpath(tree / "src", XLA_PLUGIN_DIR)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # upstream's tests of the printed results table expect 120 columns, what a process without a terminal gets;
    # pytest-xdist workers are given COLUMNS=80 unless it is set
    env["COLUMNS"] = "120"
    # the same order of sets of strings in every run: their reprs end up in failure messages, which are compared
    env["PYTHONHASHSEED"] = "0"
    if xla:
        env.update(XLA_ENV)
        if tree.name == TORCH_LOAD_AS_IN_2022_TREE and not torch_default:
            env.update(TORCH_LOAD_AS_IN_2022)
        env["PJRT_DEVICE"] = os.environ.get("PJRT_DEVICE") or "CPU"
        env["PYTHONPATH"] = engine.pythonpath(tree / "src", XLA_PLUGIN_DIR)
    return env


def run_tree(tree: Path, dirs: Sequence[str], test_timeout: float, timeout: float,
             python: str = sys.executable, xla: bool = False, workers: int = 0,
             only: Optional[Dict[str, Dict[str, str]]] = None, log=print) -> Dict:
    """Run ``dirs`` of the tree's tests (with ``only``, just those tests: ``{JUnit key: {"file", ...}}``), once more
    when pytest ended the run early (:func:`once_more_if_ended_early`); return the exit code, seconds taken and
    whether the run was stopped."""
    for stale in [*tree.glob("rerun-*.xml"), tree / SCOPE_FILE, tree / f"{TORCH_DEFAULT_RUN}.xml"]:
        if stale.exists():
            stale.unlink()  # reruns of an earlier run's differences, and its scope
    if only is None:
        return once_more_if_ended_early(tree, lambda: _pytest(
            tree, [f"tests/{d}" for d in dirs], "junit", test_timeout, timeout, python, xla, workers), log)
    files = _selection(tree / "only.txt", only)
    run = once_more_if_ended_early(tree, lambda: _pytest(
        tree, files, "junit", test_timeout, timeout, python, xla, workers, only=tree / "only.txt"), log)
    return {**run, "only": len(only)}


def _selection(path: Path, tests: Dict[str, Dict[str, str]]) -> List[str]:
    """Write the plugin's file of ``tests`` (``{JUnit key: {"file", ...}}``) to ``path``; return their modules."""
    lines, files = [], set()
    for key, entry in sorted(tests.items()):
        files.add(entry["file"])
        # a module that failed to collect has no test to name: keep all of it
        lines.append(key if node_id(key, entry["file"]) else f"file:{entry['file']}")
    path.write_text("".join(f"{line}\n" for line in lines))
    return sorted(files)


def _pytest(tree: Path, targets: Sequence[str], name: str, test_timeout: float, timeout: float,
            python: str = sys.executable, xla: bool = False, workers: int = 0, only: Optional[Path] = None,
            torch_default: bool = False) -> Dict:
    """Run pytest on ``targets`` in ``tree``, writing ``<name>.xml`` and ``<name>.log``; on XLA (``xla``) with the
    plugin that puts LightningLite there too, on ``workers`` pytest-xdist workers (0: none); ``only`` names the
    plugin's file of the tests to keep."""
    # --tb=native: pytest's own traceback parses the source of each frame, and Python 3.11's parser fails inside
    # the PyTorch profiler's tracer ("AST constructor recursion depth mismatch"); the error report then killed the
    # pytest-xdist worker and ended the whole run early
    args = ["-q", "--color=no", "-rfE", "--tb=native", "--continue-on-collection-errors",
            f"--timeout={int(test_timeout)}", "--timeout-method=signal", "-o", "junit_family=xunit1",
            *[f"--{'deselect' if '::' in left else 'ignore'}=tests/{left}" for left in sorted(LEFT_OUT)], *targets]
    args = ["-p", MARKERS_PLUGIN, *args]
    if xla:
        args = ["-p", XLA_PLUGIN, *args]
    if workers:
        args = ["-n", str(workers), *args]
    if only is not None and not xla:
        raise ForkError("selecting single tests needs the XLA plugin (--xla)")
    log = tree / ("pytest.log" if name == "junit" else f"{name}.log")
    run = engine.run_pytest(args, cwd=tree, env=_env(tree, xla, only, torch_default), python=python, timeout=timeout,
                            junit=tree / f"{name}.xml", log=log)
    return {"exit_code": run.returncode, "seconds": run.seconds, "timed_out": run.timed_out,
            "aborted": aborted(run.returncode, run.timed_out, log)}


def once_more_if_ended_early(tree: Path, start: Callable[[], Dict], log=print) -> Dict:
    """``start()`` runs the tree's tests; when pytest itself ended that run early (:func:`aborted`: a pytest-xdist
    worker lost while it reported, an internal error), the harness failed, not a test, so the tree runs once more.
    The first run's log is kept as ``pytest-ended-early.log``; a second early end stays in the result and fails the
    comparison."""
    first = start()
    if not first["aborted"]:
        return first
    kept = tree / "pytest-ended-early.log"
    if (tree / "pytest.log").exists():
        (tree / "pytest.log").replace(kept)
    log(f"pytest ended the run of {tree} early (its log: {kept}): running the tree once more")
    return {**start(), "ended_early_before": True}


def aborted(exit_code: int, timed_out: bool, log: Optional[Path] = None) -> bool:
    """Whether pytest ended before it ran every test for a reason of its own: an internal error (exit code 3, or an
    ``INTERNALERROR`` in the log, which pytest-xdist may report with another code), an interruption that was not
    the run's ``--timeout`` (2), a usage error (4). Such a run leaves tests out silently; it must fail the check."""
    if exit_code in (3, 4) or (exit_code == 2 and not timed_out):
        return True
    if log is not None and log.exists():
        with open(log, errors="replace") as f:
            return any(line.startswith("INTERNALERROR>") for line in f)
    return False


# --------------------------------------------------------------------------------------------- outcomes
def read_outcomes(xml: Path) -> Dict[str, Dict[str, str]]:
    """``{test id: {"outcome", "file", "message"}}`` of a run's JUnit XML file (xunit1: with file names).

    The id is ``<module>::<Class>::<test>[params]``, as pytest's node id without the directory. A test reported twice
    (a failing call and an error in its teardown) keeps its worst outcome (failed, error, xfailed, skipped, passed).
    """
    order = ("crashed", "timeout", "failed", "error", "xfailed", "skipped", "passed")
    outcomes: Dict[str, Dict[str, str]] = {}
    if not xml.exists():
        return outcomes
    for case in engine.read_junit(xml):
        classname, name = case["classname"], case["name"]
        key = f"{classname}::{name}" if classname else name
        outcome = failure_kind(engine.outcome(case), case["message"])
        entry = {"outcome": outcome, "file": case["file"], "message": case["message"][:500],
                 "signature": signature(case["message"], case.get("text", ""), case["file"])
                 if outcome in FAILING else ""}
        if key in outcomes and order.index(outcomes[key]["outcome"]) <= order.index(outcome):
            continue
        outcomes[key] = entry
    return outcomes


# a timeout and a crash are not failures of the test's own assertions, and a timeout on one tree never stands for a
# failure on the other: outcomes of their own (both count among ``both_fail.FAILING``)
FAILING = both_fail.FAILING
# pytest-timeout says "Timeout >300.0s" or, since 2.2, "Timeout (>300.0s) from pytest-timeout."
TIMEOUT = re.compile(r"^Failed: Timeout \(?>")
CRASHED = re.compile(r"worker '[^']+' crashed while running|Fatal Python error|terminated with signal")


def failure_kind(outcome: str, message: str) -> str:
    """``timeout`` for a test pytest-timeout stopped, ``crashed`` for one whose process died (a pytest-xdist worker
    lost, a fatal signal), else ``outcome``."""
    if outcome not in ("failed", "error"):
        return outcome
    first = (message or "").strip()
    if TIMEOUT.search(first):
        return "timeout"
    if CRASHED.search(first):
        return "crashed"
    return outcome


SIGNATURE_MESSAGE = 120


def signature(message: str, text: str, file: str) -> str:
    """What a failure says, comparable from run to run: ``<exception type> | <normalised message> | line <n>``.

    The type is the name before the message's first colon, or ``AssertionError`` for a message that is pytest's
    rewritten ``assert`` (pytest drops the ``AssertionError: `` prefix or keeps it depending on the quotes in the
    values compared, so the same failure comes both ways); the message is its first line without that prefix and
    with what changes from run to run taken out (memory addresses, numbers, temporary and checkout paths,
    whitespace); the line is the last line of the test's own file in the traceback (``file``), where the test
    failed. A part that cannot be read is empty."""
    first = next((line.strip() for line in (message or "").splitlines() if line.strip()), "")
    first = re.sub(r'^failed on (setup|teardown|call) with "', "", first).rstrip('"')
    normalised = re.sub(r"0x[0-9a-fA-F]+", "<address>", first)
    normalised = re.sub(r"(/[\w.+@-]+)+/?", "<path>", normalised)
    normalised = re.sub(r"\d+(\.\d+)?([eE][+-]?\d+)?", "N", normalised)
    lines = re.findall(re.escape(file) + r'", line (\d+)', text or "") if file else []
    lines = lines or (re.findall(re.escape(file) + r":(\d+):", text or "") if file else [])
    return canonical(f" | {normalised} | line {lines[-1] if lines else ''}")


def canonical(sig: str) -> str:
    """A signature in the one form :func:`signature` gives now, also for one recorded by an earlier harness, which
    kept the ``<type>: `` prefix in the message (cut at 200 characters with it) and left the type of a bare rewritten
    ``assert`` empty. The message keeps its first :data:`SIGNATURE_MESSAGE` characters, fewer than any earlier
    record kept after its prefix."""
    if not sig:
        return sig
    kind, _, rest = sig.partition(" | ")
    message, sep, line = rest.rpartition(" | ")
    if not sep:
        return sig
    found = re.match(r"([A-Za-z_][\w.]*): ?", message)
    if found and (not kind or found.group(1) == kind):
        kind, message = found.group(1), message[found.end():]
    elif not kind and message.startswith("assert "):
        kind = "AssertionError"
    return f"{kind} | {' '.join(message.split())[:SIGNATURE_MESSAGE].rstrip()} | {line}"


def compat_outcomes(build: Path) -> Dict[str, Dict[str, str]]:
    """The compat tree's outcomes of the last run under ``build``; where that run took only the tests the series did
    not pass (``--compat-scope not-passed``), the tests it left out are there as :data:`NOT_RUN`."""
    outcomes = read_outcomes(build / "compat" / "junit.xml")
    scope = build / "compat" / SCOPE_FILE
    if scope.exists():
        for key, file in json.loads(scope.read_text())["not_run"].items():
            outcomes.setdefault(key, {"outcome": NOT_RUN, "file": file, "message": ""})
    return outcomes


def counts(outcomes: Dict[str, Dict[str, str]]) -> Dict[str, int]:
    return engine.counts((entry["outcome"] for entry in outcomes.values()),
                         ("crashed", "timeout", "failed", "error", "xfailed", "skipped", "passed", NOT_RUN))


def _function(key: str) -> str:
    """The test function of a test id: ``mod::Class::test_x[param]`` -> ``test_x``."""
    return key.rsplit("::", 1)[-1].split("[", 1)[0]


def node_id(key: str, file: str) -> Optional[str]:
    """pytest's node id of a test id of :func:`read_junit` (``None`` for a module that failed to collect)."""
    classname, sep, name = key.rpartition("::")
    if not sep or not file.endswith(".py"):
        return None
    module = file[: -len(".py")].replace("/", ".")
    classes = classname[len(module) + 1:].split(".") if classname.startswith(module + ".") else []
    return "::".join([file, *classes, name])


def compare(results: Dict[str, Dict[str, Dict[str, str]]], updated: Dict[str, Dict[str, List[str]]],
            reruns: Optional[Dict[str, List[Dict[str, Dict[str, str]]]]] = None,
            torch_default: Optional[Dict[str, Dict[str, str]]] = None) -> Dict:
    """The tests whose outcome differs between the trees.

    Each says whether the series updates it on purpose (then it must pass on the series), and what the reruns of
    the differing tests gave on each tree (``reruns``: per tree, one outcome map per rerun). A test that gave a same
    outcome on both trees in some run is flaky here, not a difference of the trees (upstream's multi-process tests
    over gloo abort now and then on this machine, on both trees). A test that fails (or errors) on the compat tree and
    passes on the series is ``improved``: the series fixes what upstream's code fails, which needs no explanation;
    so is one that fails in every run on the compat tree and passes in some run on the series (the summary says that
    not every run passed).
    A test that fails on the series because torch's safe unpickler refuses a file its own ``torch.load`` reads, and
    that fails the same way on the compat tree under torch's own default (``torch_default``: the compat tree's outcomes
    in that run), is explained by torch's default, not by the fork.
    A test the compat tree left out (:data:`NOT_RUN`) is no difference while the series passes it, and an
    unexplained one once the series does not.
    """
    compat, series = results["compat"], results["series"]
    reruns = reruns or {}
    differences = []
    not_run = 0
    for key in sorted(set(compat) | set(series)):
        a, b = compat.get(key), series.get(key)
        if a is not None and b is not None and a["outcome"] == NOT_RUN and b["outcome"] == "passed":
            not_run += 1  # the series passes it, as it did when the compat tree left it out
            continue
        if a is not None and b is not None and a["outcome"] == b["outcome"]:
            continue
        entry = (b or a)
        by = updated.get(entry["file"], {})
        patches = by.get(_function(key), by.get("*", []))
        seen = {tree: [first["outcome"]] + [run[key]["outcome"] for run in reruns.get(tree, []) if key in run]
                for tree, first in (("compat", a), ("series", b)) if first is not None}
        # a test the compat tree left out because the series passed it is called nothing until the compat tree ran
        # it (:func:`check` runs it there): NOT_RUN matches no outcome of the series
        flaky = len(seen) == 2 and bool(set(seen["compat"]) - {NOT_RUN} & set(seen["series"]))
        differences.append({
            "test": key,
            "file": entry["file"],
            "compat": a["outcome"] if a else "absent",
            "series": b["outcome"] if b else "absent",
            "updated_by": patches,
            "on_purpose": bool(patches) and b is not None and b["outcome"] == "passed",
            "runs": seen,
            "flaky": flaky,
            # the series passes what upstream fails on the compat tree (a fix, or a test that timed out there)
            # or passes it in some run while that tree passed it in none: no run of upstream's code passing is the
            # drop-in this check guards; the summary shows the series' other outcomes (``runs``)
            "improved": bool(a and b) and "passed" in seen["series"]
            and all(o in FAILING for o in seen["compat"]),
            "compat_message": a["message"] if a else "",
            "series_message": b["message"] if b else "",
            "torch_default": _same_refusal(b, (torch_default or {}).get(key)),
        })
    return {"same": len(set(compat) & set(series)) - not_run
            - sum(1 for d in differences if "absent" not in (d["compat"], d["series"])),
            "passed_on_series_not_run_on_compat": not_run,
            "differences": differences,
            "improved": [d["test"] for d in differences if d["improved"]],
            "unexplained": [d["test"] for d in differences
                            if not d["on_purpose"] and not d["flaky"] and not d["improved"] and not d["torch_default"]]}


def _same_refusal(series: Optional[Dict[str, str]], compat: Optional[Dict[str, str]]) -> bool:
    """Whether the series' failure and the compat tree's under torch's default are one refusal of torch's safe
    unpickler: the same outcome and the same signature, torch's message in it."""
    if series is None or compat is None or series["outcome"] not in FAILING or compat["outcome"] != series["outcome"]:
        return False
    if TORCH_REFUSED not in series.get("message", "") or TORCH_REFUSED not in compat.get("message", ""):
        return False
    return canonical(series.get("signature", "")) == canonical(compat.get("signature", ""))


def previous_signatures(out: Path) -> Dict[str, str]:
    """The series' failure signatures that the results file ``out`` recorded (none when it has none)."""
    if not out.exists():
        return {}
    return json.loads(out.read_text()).get("signatures", {})


def changed_signatures(results: Dict[str, Dict[str, Dict[str, str]]], previous: Dict[str, str],
                       reruns: Optional[Dict[str, List[Dict[str, Dict[str, str]]]]] = None) -> List[Dict]:
    """The tests failing on both trees whose failure on the series says something else than the last results
    recorded (``previous``): the same outcome word hides a new way of failing. One is flaky when a rerun on the
    series gives the recorded signature again."""
    compat, series = results["compat"], results["series"]
    changed = []
    for key, entry in sorted(series.items()):
        other = compat.get(key)
        was, now = canonical(previous.get(key, "")), canonical(entry.get("signature", ""))
        if not (was and now) or was == now or other is None:
            continue
        if entry["outcome"] not in FAILING or other["outcome"] not in FAILING:
            continue
        again = [canonical(run[key].get("signature", ""))
                 for run in (reruns or {}).get("series", []) if key in run]
        changed.append({
            "test": key, "file": entry["file"], "compat": other["outcome"], "series": entry["outcome"],
            "updated_by": [], "on_purpose": False, "runs": {"series": [entry["outcome"]] + [
                run[key]["outcome"] for run in (reruns or {}).get("series", []) if key in run]},
            "flaky": was in again, "improved": False, "signature_was": was, "signature_now": now,
            "compat_message": other.get("message", ""), "series_message": entry.get("message", ""),
        })
    return changed


def both_failing(results: Dict[str, Dict[str, Dict[str, str]]]) -> Dict[str, Dict[str, str]]:
    """The tests that fail or error on both trees: ``{test id: {"node", "message"}}``, the node id being pytest's
    (the module's path for a module that failed to load) and the message the series' one."""
    compat, series = results["compat"], results["series"]
    out = {}
    for key, entry in series.items():
        other = compat.get(key)
        if other is None or entry["outcome"] not in FAILING or other["outcome"] not in FAILING:
            continue
        out[key] = {"node": node_id(key, entry["file"]) or entry["file"], "message": entry.get("message", "")}
    return out


def passed_again(failing: Collection[str], reruns: Dict[str, List[Dict[str, Dict[str, str]]]]) -> Set[str]:
    """The tests of ``failing`` (failing on both trees in the first run) that passed on the series in a rerun."""
    return {key for key in failing
            if any(run.get(key, {}).get("outcome") == "passed" for run in reruns.get("series", []))}


def to_run_again(build: Path, result: Dict) -> List[Dict]:
    """What the reruns of a run take (:func:`rerun_differences`): the unexplained differences of ``result``, and the
    tests failing on both trees that the reviewed list does not name, since a test that aborts now and then on both
    trees is flaky, not a failure to review (:data:`forkq.series.both_fail.FLAKY`)."""
    unexplained = [d for d in result["differences"] if d["test"] in result["unexplained"]]
    series = read_outcomes(build / "series" / "junit.xml")
    unlisted = [{"test": test, "file": series[test]["file"]} for test, cause in result["both_fail"]["tests"].items()
                if cause == both_fail.UNLISTED and test in series]
    return unexplained + unlisted


def rerun_differences(build: Path, differences: Sequence[Dict], times: int, test_timeout: float, timeout: float,
                      python: str = sys.executable, xla: bool = False, trees: Sequence[str] = TREES,
                      workers: int = 0) -> None:
    """Run the modules of the differing tests ``times`` more on each tree (``rerun-<i>.xml``), to tell flaky tests
    from changes: the whole module, in its order and on the run's ``workers``, since a test can fail because of an
    earlier one (a thread it left running) and pass alone."""
    files = sorted({d["file"] for d in differences if d["file"].endswith(".py")})
    if not files:
        return
    for i in range(1, times + 1):
        for tree in trees:
            _pytest(build / tree, files, f"rerun-{i}", test_timeout, timeout, python, xla, workers)


def refused_by_torch(differences: Sequence[Dict], unexplained: Sequence[str]) -> List[Dict]:
    """The unexplained differences whose failure on the series is torch's safe unpickler refusing a file."""
    return [d for d in differences if d["test"] in unexplained and TORCH_REFUSED in d.get("series_message", "")]


def rerun_under_torch_default(build: Path, differences: Sequence[Dict], test_timeout: float, timeout: float,
                              python: str = sys.executable, xla: bool = False, workers: int = 0) -> None:
    """Run the modules of ``differences`` on the compat tree once more, with torch's own default for ``torch.load``
    (``TORCH_DEFAULT_RUN``): what upstream's side does where a user does not set torch's 2022 default."""
    files = sorted({d["file"] for d in differences if d["file"].endswith(".py")})
    if files:
        _pytest(build / "compat", files, TORCH_DEFAULT_RUN, test_timeout, timeout, python, xla, workers,
                torch_default=True)


def read_reruns(build: Path) -> Dict[str, List[Dict[str, Dict[str, str]]]]:
    return {tree: [read_outcomes(xml) for xml in sorted((build / tree).glob("rerun-*.xml"))] for tree in TREES}


def _versions() -> Dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("torch", "torch_xla", "torchmetrics", "numpy", "pytest"):
        try:
            from importlib.metadata import version

            found[name] = version(name.replace("_", "-"))
        except Exception:
            found[name] = "not installed"
    return found


def _tree_version(tree: Path) -> str:
    try:
        return tree_version(tree / "src")
    except ForkError:
        return "unknown"


def report(build: Path, dirs: Sequence[str], runs: Dict[str, Dict], source: str, out: Optional[Path],
           patch_dir: Path = common.PATCH_DIR, baseline: Optional[Dict] = None, xla: bool = False,
           previous: Optional[Dict[str, str]] = None) -> Dict:
    """Compare the trees' runs under ``build``; with ``baseline`` (see :func:`write_baseline`), the compat tree's
    outcomes and reruns are the baseline's instead of a run under ``build``. ``previous`` holds the series' failure
    signatures of the last results (:func:`previous_signatures`): a test that fails on both trees and now fails on
    the series with another signature is a difference (:func:`changed_signatures`)."""
    results = {"series": read_outcomes(build / "series" / "junit.xml")}
    if baseline is None:
        results["compat"] = compat_outcomes(build)
    patches = {tree: json.loads((build / tree / "patches.json").read_text()) for tree in results}
    reruns = read_reruns(build)
    if baseline is not None:
        results["compat"] = {k: {"outcome": v["outcome"], "file": v["file"], "message": v.get("message", ""),
                                 "signature": v.get("signature", "")}
                             for k, v in baseline["outcomes"].items()}
        patches["compat"] = {"patches": baseline["patches"], "left_out": baseline["left_out"]}
        outcomes = baseline["outcomes"]
        depth = max((len(v["runs"]) for v in outcomes.values()), default=1)
        reruns["compat"] = [{k: {"outcome": v["runs"][i]} for k, v in outcomes.items() if len(v["runs"]) > i}
                            for i in range(1, depth)] + reruns["compat"]  # and what :func:`check` ran there now
    updated = {tree: updated_by(patches[tree]["patches"], patch_dir) for tree in TREES}
    # what the series updates beyond what the compat patches update
    on_purpose = {path: {fn: ps for fn, ps in fns.items() if ps != updated["compat"].get(path, {}).get(fn)}
                  for path, fns in updated["series"].items()}
    on_purpose = {path: fns for path, fns in on_purpose.items() if fns}
    torch_default_xml = build / "compat" / f"{TORCH_DEFAULT_RUN}.xml"
    torch_default = read_outcomes(torch_default_xml) if torch_default_xml.exists() else {}
    compared = compare(results, on_purpose, reruns, torch_default)
    differing = {d["test"] for d in compared["differences"]}
    changed = [d for d in changed_signatures(results, previous or {}, reruns) if d["test"] not in differing]
    compared["differences"] += changed
    compared["unexplained"] += [d["test"] for d in changed if not d["flaky"]]
    compared["same"] -= len(changed)
    failing = both_failing(results)
    classified = both_fail.classify(failing, both_fail.read_list(), "xla" if xla else "cpu",
                                    passed_again(failing, reruns))
    trees = {tree: {**patches[tree], "counts": counts(results[tree]), **runs.get(tree, {})} for tree in TREES}
    trees["series"]["version"] = _tree_version(build / "series")
    if baseline is not None:
        trees["compat"]["from_baseline"] = baseline.get("written", "")
    else:
        trees["compat"]["version"] = _tree_version(build / "compat")
    result = {
        "tag": TAG,
        "upstream_tests": source,
        "accelerator": "xla (PL_TRAINER_ACCELERATOR=tpu, PL_TRAINER_DEVICES=1; Lite through the fork's plugin)"
        if xla else "cpu",
        "dirs": list(dirs),
        "left_out_modules": dict(sorted(LEFT_OUT.items())),
        "trees": trees,
        "updated_on_purpose": on_purpose,
        **compared,
        "both_fail": {"total": len(classified), "by_cause": both_fail.by_cause(classified),
                      "causes": {**both_fail.CAUSES, **{c: f"upstream's test is written for an older {c}"
                                                        for c in both_fail.STALE_TEST_API},
                                 both_fail.FLAKY: both_fail.FLAKY_REASON},
                      "tests": {k: v["cause"] for k, v in sorted(classified.items())}},
        "signatures": {k: v["signature"] for k, v in sorted(results["series"].items()) if v.get("signature")},
        "versions": _versions(),
    }
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"stamp": stamp.make(), **result}, indent=1) + "\n")
    return result


def summary(result: Dict) -> str:
    lines = [f"upstream's {result['tag']} tests ({', '.join(result['dirs'])}):"]
    for tree in TREES:
        info = result["trees"][tree]
        c = ", ".join(f"{n} {o}" for o, n in info["counts"].items())
        took = f", {info['seconds']} s" if "seconds" in info else ""
        stopped = " (STOPPED by --timeout)" if info.get("timed_out") else ""
        stopped += " (ABORTED by pytest: tests were left out, see its log)" if info.get("aborted") else ""
        lines.append(f"  {tree:7} ({len(info['patches'])} patches): {c}{took}{stopped}")
        for name, why in info.get("left_out", {}).items():
            lines.append(f"          left out {name}: {why}")
    lines.append(f"  same outcome: {result['same']}; differing: {len(result['differences'])} "
                 f"({len(result.get('improved', []))} failing on the compat tree and passing on the series; "
                 f"{len(result['unexplained'])} neither updated on purpose nor flaky)")
    if "both_fail" in result:
        both = result["both_fail"]
        causes = ", ".join(f"{n} {cause}" for cause, n in both["by_cause"].items())
        lines.append(f"  failing on both trees: {both['total']} ({causes or 'none'})")
        for test, cause in both["tests"].items():
            if cause in (both_fail.UNLISTED, both_fail.FLAKY, *both_fail.STALE_TEST_API):
                lines.append(f"    {test}: {cause}")
    if result.get("passed_on_series_not_run_on_compat"):
        lines.append(f"  passed on the series and left out on the compat tree (--compat-scope not-passed): "
                     f"{result['passed_on_series_not_run_on_compat']}")
    for d in result["differences"]:
        why = f"; updated by {', '.join(d['updated_by'])}" if d["updated_by"] else ""
        runs = "; runs " + ", ".join(f"{tree} {'/'.join(o)}" for tree, o in d.get("runs", {}).items()) \
            if any(len(o) > 1 for o in d.get("runs", {}).values()) else ""
        unsteady = "; not every run on the series passed" if d.get("improved") and \
            set(d.get("runs", {}).get("series", ["passed"])) != {"passed"} else ""
        flaky = " (flaky)" if d.get("flaky") else f" (improved{unsteady})" if d.get("improved") else ""
        if d.get("torch_default"):
            flaky = " (torch's default: the compat tree fails it the same way without TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD)"
        lines.append(f"    {d['test']}: compat {d['compat']}, series {d['series']}{why}{runs}{flaky}")
        if d.get("signature_was"):
            lines.append(f"      fails otherwise on the series: was `{d['signature_was']}`, now `{d['signature_now']}`")
        if d["test"] in result["unexplained"]:
            # what CI prints is all a reader of a failed check has: the messages say why, the JUnit file is gone
            for tree in TREES:
                message = " ".join(d.get(f"{tree}_message", "").split())
                if message:
                    lines.append(f"      {tree} said: {message[:300]}")
    return "\n".join(lines)


def write_baseline(build: Path, dirs: Sequence[str], out: Path = BASELINE_XLA) -> Dict:
    """The compat tree's outcomes of the last run under ``build`` (first run and reruns), written to ``out``: what a
    series-only run (:func:`check`) is compared with, where running the slow compat tree again is not affordable."""
    tree = build / "compat"
    first = compat_outcomes(build)
    if not first:
        raise ForkError(f"no results of the compat tree in {tree}: run it first (make upstream-tests-xla)")
    again = read_reruns(build)["compat"]
    baseline = {
        "tag": TAG,
        "dirs": list(dirs),
        "left_out_modules": dict(sorted(LEFT_OUT.items())),
        **json.loads((tree / "patches.json").read_text()),
        "version": _tree_version(tree),
        "compat_scope": "not-passed" if (tree / SCOPE_FILE).exists() else "all",
        "written": f"{REFRESH_XLA} on {_today()}",
        "versions": _versions(),
        "outcomes": {key: {"outcome": entry["outcome"], "file": entry["file"],
                           "runs": [entry["outcome"]] + [run[key]["outcome"] for run in again if key in run],
                           **({"signature": entry["signature"]} if entry.get("signature") else {})}
                     for key, entry in sorted(first.items())},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    stamped = {"stamp": stamp.make(tree=f"the compat patches only ({baseline['version']})"), **baseline}
    out.write_text(json.dumps(stamped, indent=0, sort_keys=False) + "\n")
    return baseline


def _today() -> str:
    import datetime

    return datetime.date.today().isoformat()


def baseline_problems(baseline: Dict, patch_dir: Path = common.PATCH_DIR,
                      dirs: Sequence[str] = XLA_DIRS) -> List[str]:
    """Why a compat baseline cannot stand for the compat tree of this run: another Python, torch, torch_xla,
    torchmetrics, NumPy or pytest wrote it, other compat patches made its tree, or it ran another selection of
    upstream's tests (other folders than ``dirs``, other modules left out). Empty when it can."""
    problems = []
    if baseline.get("dirs") != list(dirs):
        problems.append(f"it ran the folders {' '.join(baseline.get('dirs') or [])}, this run {' '.join(dirs)}")
    if sorted(baseline.get("left_out_modules", {})) != sorted(LEFT_OUT):
        problems.append("it left out other modules than "
                        + (", ".join(sorted(LEFT_OUT)) if LEFT_OUT else "none"))
    now = _versions()
    for name, version in sorted(baseline.get("versions", {}).items()):
        if now.get(name) != version:
            problems.append(f"{name} {version} wrote it, {now.get(name)} runs now")
    if "versions" not in baseline:
        problems.append("it does not say which Python and packages wrote it")
    compat, _ = tree_patches("compat", patch_dir)
    if baseline.get("patches") != compat:
        added = sorted(set(compat) - set(baseline.get("patches", [])))
        gone = sorted(set(baseline.get("patches", [])) - set(compat))
        problems.append("its compat tree had other compat patches"
                        + (f" (new since: {', '.join(added)})" if added else "")
                        + (f" (gone since: {', '.join(gone)})" if gone else ""))
    return problems


def check(upstream: Path, baseline_file: Path = BASELINE_XLA, build: Path = BUILD_XLA, out: Path = RESULT_XLA,
          test_timeout: float = 300.0, timeout: float = 3600.0, reruns: int = 1, workers: int = 2,
          log=print, patch_dir: Path = common.PATCH_DIR, dirs: Sequence[str] = XLA_DIRS) -> Dict:
    """The series on XLA against the committed compat baseline: the series tree alone is built and run on the
    baseline's folders (which must be ``dirs``), its differing tests run ``reruns`` more times, and the comparison
    goes to ``out``."""
    if not baseline_file.exists():
        raise ForkError(f"no baseline of the compat tree at {baseline_file}: write it with `{REFRESH_XLA}`")
    baseline = json.loads(baseline_file.read_text())
    problems = baseline_problems(baseline, patch_dir, dirs)
    if problems:
        raise ForkError(f"the compat baseline {baseline_file.name} was not written for this run: "
                        + "; ".join(problems) + f". Write it again with `{REFRESH_XLA}`")
    dirs = baseline["dirs"]
    build = build.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        tests_root = Path(tmp) / "upstream"
        source = extract_tests(upstream, tests_root)
        tree = build_tree("series", tests_root, build, patch_dir)
    log(f"running {len(dirs)} folders of upstream's tests on XLA on {tree}, against {baseline_file.name}")
    runs = {"series": run_tree(tree, dirs, test_timeout, timeout, xla=True, workers=workers, log=log)}
    log(f"series done in {runs['series']['seconds']} s")
    for stale in [*build.glob("*/rerun-*.xml"), *build.glob(f"*/{TORCH_DEFAULT_RUN}.xml")]:
        stale.unlink()
    previous = previous_signatures(out)
    result = report(build, dirs, runs, source, None, patch_dir, baseline=baseline, xla=True, previous=previous)
    unexplained = [d for d in result["differences"] if d["test"] in result["unexplained"]]
    again = to_run_again(build, result)
    if again and reruns > 0:
        log(f"running the modules of the {len(again)} unexplained differences and unlisted tests failing on both"
            f" trees {reruns} more times on the series")
        rerun_differences(build, again, reruns, test_timeout, timeout, xla=True, trees=("series",),
                          workers=workers)
    left_out = [d for d in unexplained if d["compat"] in (NOT_RUN, "absent")]
    if left_out:
        # the baseline has no outcome of these on the compat tree: run them there before calling them anything
        log(f"running the modules of {len(left_out)} tests the baseline has no outcome of on the compat tree")
        with tempfile.TemporaryDirectory() as tmp:
            tests_root = Path(tmp) / "upstream"
            extract_tests(upstream, tests_root)
            build_tree("compat", tests_root, build, patch_dir)
        rerun_differences(build, left_out, max(1, reruns), test_timeout, timeout, xla=True, trees=("compat",),
                          workers=workers)
    result = report(build, dirs, runs, source, None, patch_dir, baseline=baseline, xla=True, previous=previous)
    refused = refused_by_torch(result["differences"], result["unexplained"])
    if refused:
        log(f"running the modules of {len(refused)} tests whose file torch's safe unpickler refuses on the compat tree"
            " under torch's own default")
        if not left_out:  # else built above, for this run
            with tempfile.TemporaryDirectory() as tmp:
                tests_root = Path(tmp) / "upstream"
                extract_tests(upstream, tests_root)
                build_tree("compat", tests_root, build, patch_dir)
        rerun_under_torch_default(build, refused, test_timeout, timeout, xla=True, workers=workers)
    return report(build, dirs, runs, source, out, patch_dir, baseline=baseline, xla=True, previous=previous)


# --------------------------------------------------------------------------------------------- CLI
def _previous_runs(out: Path) -> Dict[str, Dict]:
    """What the last run recorded of each tree's pytest run (exit code, seconds, stopped), kept for the trees that do
    not run again."""
    previous = json.loads(out.read_text()) if out.exists() else {}
    return {t: {k: v for k, v in previous.get("trees", {}).get(t, {}).items()
                if k in ("exit_code", "seconds", "timed_out", "aborted")} for t in TREES}


def compare_last(build: Path, dirs: Sequence[str], out: Path, upstream: Optional[Path], xla: bool = False) -> Dict:
    """The trees' last runs under ``build``, compared again and written to ``out``."""
    previous = json.loads(out.read_text()) if out.exists() else {}
    source = previous.get("upstream_tests", str(upstream))
    return report(build.resolve(), dirs, _previous_runs(out), source, out, xla=xla, previous=previous_signatures(out))


def run(upstream: Path, dirs: Sequence[str] = DIRS, build: Path = BUILD, out: Path = RESULT,
        trees: Sequence[str] = TREES, test_timeout: float = 600.0, timeout: float = 6 * 3600.0,
        parallel: bool = False, reruns: int = 2, log=print, xla: bool = False, workers: int = 0,
        baseline: Optional[Path] = None, compat_scope: str = "all", patch_dir: Path = common.PATCH_DIR) -> Dict:
    """Build ``trees`` with the tag's tests from ``upstream``, run ``dirs`` on each (at once with ``parallel``), run
    the differing tests ``reruns`` more times, and write the comparison to ``out``; on XLA with the compat tree run,
    also its outcomes to ``baseline`` (:func:`write_baseline`).

    With ``compat_scope="not-passed"`` (XLA only) the series runs first and the compat tree then runs only the tests
    the series did not pass; the others are :data:`NOT_RUN` there."""
    if compat_scope not in COMPAT_SCOPES:
        raise ForkError(f"--compat-scope is one of {', '.join(COMPAT_SCOPES)}, not {compat_scope!r}")
    targeted = compat_scope == "not-passed" and "compat" in trees
    if targeted and not xla:
        raise ForkError("--compat-scope not-passed is for the XLA run (--xla): on the CPU both trees run in minutes")
    if targeted and parallel:
        raise ForkError("--compat-scope not-passed runs the series before the compat tree: leave out --parallel")
    build = build.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        tests_root = Path(tmp) / "upstream"
        source = extract_tests(upstream, tests_root)
        built = {tree: build_tree(tree, tests_root, build, patch_dir) for tree in trees}
    runs = _previous_runs(out)

    def one(tree: str) -> None:
        only = None
        if targeted and tree == "compat":
            series = read_outcomes(build / "series" / "junit.xml")
            if not series:
                raise ForkError(f"no results of the series in {build / 'series'}: run it first (--trees series compat)")
            only = {k: v for k, v in series.items() if v["outcome"] != "passed"}
            log(f"running the {len(only)} of {len(series)} tests the series does not pass on {built[tree]}")
        else:
            log(f"running {len(dirs)} folders of upstream's tests on {built[tree]}")
        runs[tree] = run_tree(built[tree], dirs, test_timeout, timeout, xla=xla, workers=workers, only=only, log=log)
        if only is not None:
            not_run = {k: v["file"] for k, v in series.items() if k not in only}
            (built[tree] / SCOPE_FILE).write_text(json.dumps({"scope": compat_scope, "not_run": not_run}) + "\n")
        log(f"{tree} done in {runs[tree]['seconds']} s")

    if parallel:
        threads = [threading.Thread(target=one, args=(tree,)) for tree in trees]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for tree in sorted(trees, key=lambda t: t != "series") if targeted else trees:
            one(tree)
    missing = [t for t in TREES if not (build / t / "junit.xml").exists()]
    if missing:
        raise ForkError(f"no test results for {', '.join(missing)} in {build}: run them (--trees)")
    previous = previous_signatures(out)
    result = report(build, dirs, runs, source, None, patch_dir, xla=xla, previous=previous)
    # a difference already explained (updated on purpose, improved) needs no rerun; the others may be flaky, and so
    # may a test failing on both trees that the reviewed list does not name
    again = to_run_again(build, result)
    if again and reruns > 0:
        log(f"running the modules of the {len(again)} unexplained differences and unlisted tests failing on both"
            f" trees {reruns} more times on each tree")
        rerun_differences(build, again, reruns, test_timeout, timeout, xla=xla, workers=workers)
    if xla and "compat" in trees:
        result = report(build, dirs, runs, source, None, patch_dir, xla=xla, previous=previous)
        refused = refused_by_torch(result["differences"], result["unexplained"])
        if refused:
            log(f"running the modules of {len(refused)} tests whose file torch's safe unpickler refuses on the compat"
                " tree under torch's own default")
            rerun_under_torch_default(build, refused, test_timeout, timeout, xla=xla, workers=workers)
    if xla and "compat" in trees and baseline is not None:
        write_baseline(build, dirs, baseline)
    return report(build, dirs, runs, source, out, patch_dir, xla=xla, previous=previous)
