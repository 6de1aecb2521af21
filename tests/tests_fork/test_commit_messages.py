"""The commit message rule of docs/maintaining.md, checked (``forkq.commitmsg``): a subject of at most 60 characters,
a blank line, a body that explains, and no patch numbers. ``make hooks`` installs the ``commit-msg`` hook that refuses
a message breaking it; ``make check-commits`` (CI) checks the commits a branch adds."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forkq import cli, commitmsg, common

GOOD = "Tools: one pytest runner\n\nThe four ways pytest was run are one: what changed, and why.\n"


@pytest.mark.parametrize("message", [
    GOOD,
    "A subject of exactly sixty characters, no more and no less!!\n\nBody.\n",
    # what git drops: comment lines, the diff below the scissors line of `git commit -v`
    GOOD + "# Please enter the commit message for your changes.\n# On branch x\n",
    GOOD + "# ------------------------ >8 ------------------------\n# Do not modify\ndiff --git a/0057 b/0057\n",
    # numbers that are not patch numbers
    "Bench: 1248.5 ms a step on torch 2.9\n\nMeasured 2026-11-29T00:00:00+0000 with 1.8.6+xla.61.ga0d7d095,\n"
    "ratio 0.79; 1000 steps, issue #15884, 2 of 5 rounds.\n",
])
def test_messages_that_follow_the_rule(message):
    assert commitmsg.problems(message) == []


@pytest.mark.parametrize("message, problem", [
    ("A subject that runs on for longer than the sixty characters allowed\n\nBody.\n", "has 67 characters; at most 60"),
    ("Subject\nBody right below it.\n", "a blank line must separate the subject from the body"),
    ("Subject only\n", "the body is missing"),
    ("Subject only\n\n# only a comment\n", "the body is missing"),
    ("\n\n", "the message is empty"),
    ("Rebase 0057 onto the storage patches\n\nBody.\n", "the subject names the patch '0057'"),
    ("Renumber the preemption patch\n\nIt moves from 0055 to 0057.\n", "the body names the patch '0055'"),
    ("Fix the hooks\n\nSee 0050-feature-xla-spmd-strategy.patch.\n",
     "the body names the patch '0050-feature-xla-spmd-strategy.patch'"),
    ("Ports for 0047-0049\n\nBody.\n", "the subject names the patch '0049'"),
])
def test_messages_that_break_the_rule(message, problem):
    found = commitmsg.problems(message)
    assert any(problem in p for p in found), found


def _git(repo: Path, *args: str, check: bool = True, message: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, GIT_AUTHOR_NAME="T", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="T",
               GIT_COMMITTER_EMAIL="t@example.com", GIT_CEILING_DIRECTORIES=str(repo.parent))
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=check,
                          input=message or None)


@pytest.fixture
def repo(tmp_path, monkeypatch) -> Path:
    """A repository holding this checkout's tools, with ``make hooks``' hook installed."""
    root = tmp_path / "repo"
    shutil.copytree(common.ROOT / "tools", root / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    _git(root.parent, "init", "-q", "-b", "main", str(root))
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "--no-verify", "-m", "Start")
    monkeypatch.setattr(common, "ROOT", root)
    assert cli.main(["hooks"]) == 0
    return root


def _commit(repo: Path, message: str, name: str) -> subprocess.CompletedProcess:
    (repo / name).write_text(name)
    _git(repo, "add", name)
    return _git(repo, "commit", "-q", "-F", "-", check=False, message=message)


def test_the_hook_refuses_a_message_that_breaks_the_rule(repo):
    hook = Path(_git(repo, "rev-parse", "--git-path", "hooks").stdout.strip())
    hook = (hook if hook.is_absolute() else repo / hook) / "commit-msg"
    assert commitmsg.HOOK_MARK in hook.read_text() and os.access(hook, os.X_OK)
    refused = _commit(repo, "Move 0057 after the storage patches\n", "a")
    assert refused.returncode != 0
    assert "the subject names the patch '0057'" in refused.stderr and "the body is missing" in refused.stderr
    assert _commit(repo, GOOD, "a").returncode == 0
    # a merge's message is git's own
    _git(repo, "checkout", "-q", "-b", "side", "HEAD~1")
    assert _commit(repo, GOOD, "b").returncode == 0
    _git(repo, "checkout", "-q", "main")
    assert _git(repo, "merge", "--no-ff", "-q", "--no-edit", "side", check=False).returncode == 0
    # installing again is fine; a hook of someone else's is kept unless forced
    assert cli.main(["hooks"]) == 0
    hook.write_text("#!/bin/sh\nexit 0\n")
    assert cli.main(["hooks"]) == 1
    assert cli.main(["hooks", "--force"]) == 0


def test_the_commits_a_branch_adds_are_checked(repo, capsys):
    base = _git(repo, "rev-parse", "HEAD").stdout.strip()
    _commit(repo, GOOD, "a")
    _git(repo, "commit", "-q", "--no-verify", "--allow-empty", "-m", "Renumber 0055 to 0057")
    assert cli.main(["commit-msg", "--since", base]) == 1
    out = capsys.readouterr().out
    assert "'Renumber 0055 to 0057': the subject names the patch '0055'" in out
    assert "2 commit(s) since" in out and "1 break the commit message rule" in out
    assert cli.main(["commit-msg", "--since", "HEAD"]) == 0
    # a clean clone of main has no other base: nothing is checked, and the log says so
    for base in ("origin/main", "", "0" * 40):
        assert cli.main(["commit-msg", "--since", base]) == 0
        assert "no base to compare against" in capsys.readouterr().out


def test_ci_checks_the_commits_of_a_submission():
    run = (common.ROOT / ".ci" / "run").read_text()
    assert "make check-commits" in run and run.index("make check-commits") < run.index("make test")
    dry = subprocess.run(["make", "-n", "--no-print-directory", "check-commits", "SINCE=abc"], cwd=common.ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert 'tools/fork.py commit-msg --since "abc"' in dry
    workflow = (common.ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert 'make check-commits SINCE="$BEFORE"' in workflow and "fetch-depth: 0" in workflow


def test_the_checker_runs_from_the_fork_script():
    """The hook calls the checker through tools/fork.py."""
    proc = subprocess.run([sys.executable, str(common.ROOT / "tools" / "fork.py"), "commit-msg", "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "--since BASE" in proc.stdout
