"""The before/after engine both series share: run pytest on a tree, read its JUnit report, judge the flip.

A fix is proven when each of its tests fails (a failure or an error) without it and passes with it; a skipped test
proves nothing either way."""
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional, Sequence

OUTCOMES = ("passed", "failed", "error", "skipped")


class Run:
    """One pytest run: its exit code (None when it timed out), the end of its output, and its test cases
    (``[{"classname", "file", "name", "outcome", "stdout"}]``, outcome one of OUTCOMES)."""

    def __init__(self, returncode: Optional[int], tail: str, cases: List[Dict[str, str]]) -> None:
        self.returncode, self.tail, self.cases = returncode, tail, cases


def read_junit(report: Path) -> List[Dict[str, str]]:
    """The test cases of a JUnit XML report, in order: ``classname``, ``file``, ``name``, ``outcome`` (one of
    OUTCOMES), ``message`` (of the failure, error or skip), ``skip_type`` (``pytest.xfail`` for an expected failure)
    and ``stdout``."""
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
                      "skip_type": "" if skipped is None else skipped.get("type", ""),
                      "stdout": case.findtext("system-out") or ""})
    return cases


def run_pytest(args: Sequence[str], cwd: Path, env: Dict[str, str], python: str = sys.executable,
               timeout: Optional[float] = None, junit: Optional[Path] = None) -> Run:
    """``python -m pytest -p no:cacheprovider --junitxml=<report> *args`` in ``cwd``; the report is ``junit`` when
    given (kept), else a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml" if junit is None else junit
        if junit is not None and report.exists():
            report.unlink()
        cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}", *args]
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
            returncode, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
        except subprocess.TimeoutExpired:
            returncode, tail = None, f"pytest did not finish within {timeout:.0f} s"
        cases = read_junit(report) if report.exists() else []
    return Run(returncode, tail, cases)


def pythonpath(*paths: Path, inherit: bool = False) -> str:
    """``PYTHONPATH`` for a run: ``paths`` first, then (with ``inherit``) the caller's."""
    parts = [str(p) for p in paths] + ([os.environ.get("PYTHONPATH", "")] if inherit else [])
    return os.pathsep.join(parts).rstrip(os.pathsep)


def flipped(before: str, after: str) -> bool:
    """A test proves its fix: it fails (or errors) without the fix and passes with it."""
    return before in ("failed", "error") and after == "passed"
