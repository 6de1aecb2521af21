"""The Makefile: `make help` names every target, and the maintainer's targets run the tools of the package from the
one patches root (checked with `make -n`, which runs nothing)."""
import re
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _targets():
    text = (REPO / "Makefile").read_text()
    return sorted({m for m in re.findall(r"^([a-z][\w.-]*):(?!=)", text, flags=re.M)})


#: the environment of the `make` runs: not the variables of a `make` these tests run under (`make test STACK=torchtpu`
#: exports STACK to its recipes, and MAKEFLAGS carries it to sub-makes)
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS")) and k != "STACK"}


def _make(*args: str) -> str:
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=60, env=ENV).stdout


def test_help_lists_every_target():
    shown = set(re.findall(r"^make ([\w.-]+)", _make("help"), flags=re.M))
    assert shown == set(_targets()) - {"help"}


@pytest.mark.parametrize("target, command", [
    ("fork", "tools/fork.py materialize"),
    ("check-series", "tools/fork.py check"),
    ("series-comments", "tools/fork.py series-comments --write"),
    ("pr-series", "tools/fork.py pr-series export --out build/pr-series --doc docs/upstream-prs.md"),
    ("pr-series", "tools/fork.py pr-series-266 export --out build/pr-series-2.6.6"),
    ("verify-2.6.6", ".venv/bin/python tools/fork.py pr-series-266 verify"),
    ("before-after", ".venv/bin/python tools/fork.py before-after"),
    ("upstream-tests-xla-check UPSTREAM=/up", ".venv/bin/python tools/fork.py upstream-tests check --upstream /up"),
    ("upstream-test-edits UPSTREAM=/up", ".venv/bin/python tools/fork.py upstream-tests edits --upstream /up"),
])
def test_targets_run_the_tools(target, command):
    out = subprocess.run(["make", "-n", "--no-print-directory", *target.split()], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=60, env=ENV).stdout
    assert command in out


def test_refresh_restat_and_new_patch_take_patch():
    def dry(*args):
        return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=60, env=ENV)

    assert "tools/fork.py refresh 0005" in dry("refresh", "PATCH=0005").stdout
    assert "tools/fork.py restat 0005" in dry("restat", "PATCH=0005").stdout
    out = dry("new-patch", "PATCH=0046-x.patch", "SUBJECT=S", "BODY=b", "KIND=fix", "FORWARDED=no").stdout
    assert 'tools/fork.py new 0046-x.patch --subject "S" --body-file "b" --kind "fix" --forwarded "no"' in out
    assert "--bug" not in out
    assert '--bug "https://x"' in dry("new-patch", "PATCH=0046-x.patch", "BUG=https://x").stdout
