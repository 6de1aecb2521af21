"""The Pythons the fork supports are stated once (``requirements/runtime.txt``) and everything agrees with it:
``setup.py``'s ``python_requires`` (checked in the built wheel by ``test_install.py``), the README, the CI matrix, and
the check that ``make demo`` / ``make test`` run before building ``.venv``. Outside the range the check stops within
seconds with the range and how to pick another interpreter; it is run here against fake interpreters that report
another version or platform."""
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
from forkq import common, upstream  # noqa: E402

RANGE = upstream.python_range()


def _fake_python(tmp_path: Path, version: tuple, machine: str = None) -> Path:
    """An executable that runs this machine's Python but reports ``version`` (and ``machine``) to the code it runs,
    as an interpreter of that version on that platform would."""
    site = tmp_path / f"site-{'-'.join(map(str, version))}-{machine}"
    site.mkdir()
    lines = ["import collections, platform, sys",
             "V = collections.namedtuple('version_info', 'major minor micro releaselevel serial')",
             f"sys.version_info = V({version[0]}, {version[1]}, 7, 'final', 0)"]
    if machine:
        lines.append(f"platform.machine = lambda: {machine!r}")
    (site / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    real = getattr(sys, "_base_executable", None) or sys.executable
    exe = tmp_path / f"python{version[0]}.{version[1]}-{machine or 'here'}"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{real}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def _make(target: str, tmp_path: Path, **variables) -> "tuple[subprocess.CompletedProcess, float]":
    # not the variables of a `make` this test runs under (`make test STACK=torchtpu` exports STACK to its recipes)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS")) and k != "STACK"}
    cmd = ["make", "-C", str(REPO), target, *[f"{k}={v}" for k, v in variables.items()]]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return proc, time.monotonic() - start


def test_the_range_is_the_pythons_of_the_pinned_wheels():
    # torch_xla 2.9.0 has wheels for CPython 3.10-3.13 on x86-64 Linux (asked of PyPI); torch 2.9.0 for 3.10-3.14
    assert upstream.runtime_pins()["torch_xla"] == "2.9.0"
    assert (RANGE.specifier, RANGE.versions) == (">=3.10,<3.14", ["3.10", "3.11", "3.12", "3.13"])
    assert (RANGE.system, RANGE.machine) == ("linux", "x86_64")


def test_readme_names_the_range():
    readme = (REPO / "README.md").read_text()
    assert f"{RANGE.describe()} (the Pythons that torch_xla {upstream.runtime_pins()['torch_xla']} has wheels for)" in \
        readme
    assert not re.search(r"Python 3\.\d+\+", readme), "a stale open-ended Python version in the README"


def test_ci_runs_the_lowest_and_the_highest_python():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    job = workflow["jobs"]["test"]  # (the other job checks commit messages, with the runner's own Python)
    assert job["strategy"]["matrix"]["python"] == [RANGE.versions[0], RANGE.versions[-1]]
    (setup,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
    assert setup["with"]["python-version"] == "${{ matrix.python }}"


@pytest.mark.parametrize(("version", "machine", "reason"), [
    ((3, 9), None, "Python 3.9 is outside the versions the pinned stack supports"),
    ((3, 14), None, "Python 3.14 is outside the versions the pinned stack supports"),
    ((3, 12), "aarch64", "this platform (linux, aarch64) has no wheel of the pinned stack"),
])
@pytest.mark.parametrize("target", ["demo", "test"])
def test_make_stops_at_once_outside_the_range(tmp_path, version, machine, reason, target):
    python = _fake_python(tmp_path, version, machine)
    venv = tmp_path / "venv"
    proc, seconds = _make(target, tmp_path, PYTHON=python, VENV=venv)
    assert proc.returncode != 0
    assert seconds < 30, f"the check took {seconds:.0f} s"
    assert reason in proc.stderr, proc.stderr
    assert f"have wheels for {RANGE.describe()} on linux x86_64 only" in proc.stderr
    assert "`make demo PYTHON=python3.13`" in proc.stderr
    assert not venv.exists(), "the environment was created before the check"


def test_a_venv_made_earlier_by_another_python_is_refused(tmp_path):
    """A .venv left from before the check (made by an unsupported Python) is checked too, not reused silently."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stale = _fake_python(tmp_path, (3, 9))
    os.symlink(stale, venv / "bin" / "python")
    proc, _ = _make("venv", tmp_path, PYTHON=_fake_python(tmp_path, (3, 12)), VENV=venv)
    assert proc.returncode != 0
    assert "Python 3.9 is outside the versions the pinned stack supports" in proc.stderr, proc.stderr
    assert not (venv / ".installed-requirements").exists()


def test_an_interpreter_in_the_range_passes(tmp_path):
    for version in RANGE.versions:
        major, minor = map(int, version.split("."))
        proc = subprocess.run([str(_fake_python(tmp_path, (major, minor), "x86_64")),
                               str(REPO / "tools" / "check_python.py")], capture_output=True, text=True, timeout=60)
        assert (proc.returncode, proc.stderr) == (0, ""), version


def test_a_range_without_its_lines_is_an_error(tmp_path):
    broken = tmp_path / "runtime.txt"
    broken.write_text("torch==2.9.0\ntorch_xla==2.9.0\n")
    with pytest.raises(common.ForkError, match="python-requires"):
        upstream.python_range(broken)
