"""The rule for this repository's commit messages (``docs/maintaining.md``, "Commit messages"), checked.

A message has a subject of at most 60 characters, a blank line, then a body that explains what changed and why.
Neither names a patch by its number (``0057``) or its file name (``NNNN-name.patch``): the series is
reordered and renumbered, behaviours are not. The commits of this repository are meant, not the patches inside it.

``make hooks`` installs a ``commit-msg`` hook that checks each message as it is written; CI checks the commits a
submission adds (``fork.py commit-msg --since BASE``). Merge commits are left out: git writes their messages.
"""
import re
from pathlib import Path
from typing import List, Optional, Tuple

from .common import git

SUBJECT_MAX = 60
# a patch number: four digits from 0001 to 0999, standing alone (not in a date, a version or a longer number)
PATCH_NUMBER = re.compile(r"(?<![\w.:])0(?!000)\d{3}(?![\w.:])")
PATCH_FILE = re.compile(r"\b\d{4}-[A-Za-z0-9][A-Za-z0-9_-]*\.patch\b")
# ``git commit -v`` shows the diff below this line; git drops it, and everything after it, from the message
SCISSORS = "# ------------------------ >8 ------------------------"
HOOK_MARK = "# forkq commit-msg hook"


def clean(message: str) -> str:
    """The message as git stores it with its default cleanup: no comment lines, nothing below the scissors line,
    no trailing blank lines."""
    lines = message.split("\n")
    if SCISSORS in lines:
        lines = lines[: lines.index(SCISSORS)]
    return "\n".join(line.rstrip() for line in lines if not line.startswith("#")).strip("\n")


def _numbers(text: str) -> List[str]:
    return [m.group(0) for m in PATCH_FILE.finditer(text)] + \
        [m.group(0) for m in PATCH_NUMBER.finditer(PATCH_FILE.sub("", text))]


def problems(message: str) -> List[str]:
    """What breaks the rule in ``message``; empty when it follows it."""
    lines = clean(message).split("\n")
    subject = lines[0]
    if not subject.strip():
        return ["the message is empty: write a subject, a blank line, then a body that explains"]
    found = []
    if len(subject) > SUBJECT_MAX:
        found.append(f"the subject has {len(subject)} characters; at most {SUBJECT_MAX}")
    if len(lines) > 1 and lines[1].strip():
        found.append("a blank line must separate the subject from the body")
    body = "\n".join(lines[1:]).strip()
    if not body:
        found.append("the body is missing: after a blank line, say what changed and why (wrapped at 72 characters)")
    for where, text in (("subject", subject), ("body", body)):
        for number in _numbers(text):
            found.append(f"the {where} names the patch {number!r}: name the behaviour instead, patch numbers change "
                         "when the series is renumbered")
    return found


def commits_since(base: str, repo: Path, head: str = "HEAD") -> Optional[List[Tuple[str, str]]]:
    """``[(short sha, message)]`` of the commits (merges left out) that ``head`` has and ``base`` does not, oldest
    first; None when ``base`` names no commit here."""
    if not base.strip() or re.fullmatch(r"0+", base) or \
            git(["rev-parse", "-q", "--verify", f"{base}^{{commit}}"], cwd=repo, check=False).returncode != 0:
        return None
    shas = git(["rev-list", "--no-merges", "--reverse", f"{base}..{head}"], cwd=repo).stdout.split()
    return [(sha[:10], git(["log", "-1", "--format=%B", sha], cwd=repo).stdout) for sha in shas]


def hook_script() -> str:
    """The ``commit-msg`` hook: the checker of the checkout being committed to, when that checkout has it (the hooks of
    a repository are shared by its worktrees, and an older branch may not have the checker yet)."""
    return f"""#!/bin/sh
{HOOK_MARK}: installed by `make hooks`; checks the rule of docs/maintaining.md ("Commit messages")
top=$(git rev-parse --show-toplevel) || exit 0
[ -f "$top/tools/forkq/commitmsg.py" ] || exit 0
# a merge's message is git's own
git rev-parse -q --verify MERGE_HEAD >/dev/null && exit 0
exec python3 "$top/tools/fork.py" commit-msg "$1"
"""
