"""The one pytest runner of the fork's tools and the one reader of its results (JUnit XML), and the judgement of a
flip. ``before_after``, ``pr186`` (``check-tag``), ``pr266`` (``verify``) and ``upstream_tests`` all run pytest here.

A fix is proven when each of its tests fails (a failure or an error) without it and passes with it; a skipped test
proves nothing either way."""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

OUTCOMES = ("passed", "failed", "error", "skipped")
# seconds pytest has to write its report after the SIGINT that ends a run past its timeout
GRACE = 60.0


class Run:
    """One pytest run: its exit code, its output (``tail``: the last 3000 characters), its test cases
    (:func:`read_junit`), how long it took, and whether it was stopped at its timeout."""

    def __init__(self, returncode: Optional[int], output: str, cases: List[Dict[str, str]], seconds: float = 0.0,
                 timed_out: bool = False) -> None:
        self.returncode, self.output, self.cases = returncode, output, cases
        self.seconds, self.timed_out = seconds, timed_out

    @property
    def tail(self) -> str:
        return self.output[-3000:]


def read_junit(report: Path) -> List[Dict[str, str]]:
    """The test cases of a JUnit XML report, in order: ``classname``, ``file``, ``name``, ``outcome`` (one of
    OUTCOMES), ``message`` (of the failure, error or skip), ``text`` (the failure's or error's traceback),
    ``skip_type`` (``pytest.xfail`` for an expected failure) and ``stdout``. A module that failed to collect is a case
    with the outcome ``error``."""
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        found = {tag: case.find(tag) for tag in ("failure", "error", "skipped")}
        outcome = next((o for o, tag in (("failed", "failure"), ("error", "error"), ("skipped", "skipped"))
                        if found[tag] is not None), "passed")
        element = next((e for e in found.values() if e is not None), None)
        skipped = found["skipped"]
        cases.append({"classname": case.get("classname") or "", "file": case.get("file") or "",
                      "name": case.get("name") or "", "outcome": outcome,
                      "message": "" if element is None else element.get("message", ""),
                      "text": "" if element is None or outcome == "skipped" else (element.text or ""),
                      "skip_type": "" if skipped is None else skipped.get("type", ""),
                      "stdout": case.findtext("system-out") or ""})
    return cases


def outcome(case: Dict[str, str]) -> str:
    """A case's outcome, with an expected failure (``pytest.xfail``) told apart from a skip: ``xfailed``."""
    return "xfailed" if case["skip_type"] == "pytest.xfail" else case["outcome"]


def counts(outcomes: Iterable[str], order: Sequence[str] = ("failed", "error", "xfailed", "skipped", "passed")
           ) -> Dict[str, int]:
    """``{outcome: number}`` of the outcomes that occur, in ``order``."""
    found = list(outcomes)
    return {o: found.count(o) for o in order if o in found}


def _wait(proc: "subprocess.Popen[bytes]", timeout: Optional[float]) -> bool:
    """Wait for ``proc`` (the leader of its own process group); True when it ran past ``timeout`` and was stopped."""
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # pytest writes the report of what ran so far on an interrupt
        try:
            proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return True
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


#: the signals whose handlers upstream's tests expect as a shell starts a process (its signal connector's tests check
#: SIGHUP's and SIGUSR1's); a run started under `nohup` or in a script's background inherits them ignored
_DEFAULT_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def _default_signal_handlers() -> None:
    """In the child, before pytest starts: every signal of :data:`_DEFAULT_SIGNALS` back to its default, so that the
    tests run the same however this tool was started (Python then installs its own SIGINT handler)."""
    for sig in _DEFAULT_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def run_pytest(args: Sequence[str], cwd: Path, env: Dict[str, str], python: str = sys.executable,
               timeout: Optional[float] = None, junit: Optional[Path] = None, log: Optional[Path] = None) -> Run:
    """``python -m pytest -p no:cacheprovider --junitxml=<report> *args`` in ``cwd``, in a process group of its own,
    with the signals' default handlers.

    The report is ``junit`` when given (kept), else a temporary file; the output (the command on its first line)
    goes to ``log`` when given (kept), else to a temporary file. After ``timeout`` seconds pytest is interrupted
    (it still writes the report of what ran) and killed ``GRACE`` seconds later; an error or Ctrl-C here kills it
    at once."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml" if junit is None else junit
        out = Path(tmp) / "pytest.log" if log is None else log
        if report.exists():
            report.unlink()
        cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}", *args]
        started = time.monotonic()
        with open(out, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_default_signal_handlers)
            timed_out = _wait(proc, timeout)
        output = out.read_text(errors="replace")
        if timed_out:
            output += f"\npytest did not finish within {timeout:.0f} s\n"
        cases = read_junit(report) if report.exists() else []
    return Run(proc.returncode, output, cases, round(time.monotonic() - started, 1), timed_out)


def collect(args: Sequence[str], cwd: Path, env: Dict[str, str], python: str = sys.executable
            ) -> Tuple[Run, List[str]]:
    """Collect only (``--collect-only -q``): the run (exit code 0 when every module collected; a module that did not
    is an ``error`` case) and the node ids collected."""
    run = run_pytest(["--collect-only", "-q", *args], cwd, env, python)
    nodes = [line for line in run.output.splitlines()[1:] if re.match(r"[^\s:]+\.py::", line)]
    return run, nodes


def pythonpath(*paths: Path, inherit: bool = False) -> str:
    """``PYTHONPATH`` for a run: ``paths`` first, then (with ``inherit``) the caller's."""
    parts = [str(p) for p in paths] + ([os.environ.get("PYTHONPATH", "")] if inherit else [])
    return os.pathsep.join(parts).rstrip(os.pathsep)


def flipped(before: str, after: str) -> bool:
    """A test proves its fix: it fails (or errors) without the fix and passes with it."""
    return before in ("failed", "error") and after == "passed"
