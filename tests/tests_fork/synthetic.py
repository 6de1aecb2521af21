"""Synthetic patch queues for the packaging and PR-series tests: real ``git format-patch`` files made with git on
top of the pinned upstream tree, so the tests do not depend on what the real series holds today."""
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from forkq import common, tree, upstream

REPO = Path(__file__).resolve().parents[2]


BODY = "A synthetic patch of the test suite; its body says what was wrong\nand why this change."
Edit = Callable[[Path], None]  # receives the repository root (with src/ inside) and edits it in place


def git(args: Sequence[str], cwd: Path, **kw) -> str:
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(Path(cwd).resolve().parent), GIT_AUTHOR_NAME="Test",
               GIT_AUTHOR_EMAIL="test@example.com", GIT_COMMITTER_NAME="Test", GIT_COMMITTER_EMAIL="test@example.com",
               GIT_AUTHOR_DATE="2026-11-29T00:00:00+0000", GIT_COMMITTER_DATE="2026-11-29T00:00:00+0000")
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"git {args} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def make_queue(root: Path, patches: Sequence[Dict]) -> Path:
    """Write ``root/patches`` (with ``series``) and ``root/upstream.lock``; return ``root``.

    Each patch is ``{"name", "subject", "kind", "edit", "bug"?}``; ``edit`` runs on a git tree holding upstream
    plus the patches before it, and the patch is that commit's ``git format-patch``.
    """
    lock = upstream.read_lock()
    work = root / "work"
    wheel = upstream.fetch_wheel("pytorch-lightning", lock["pytorch-lightning"])
    upstream.unpack_packages(wheel, work / "src")
    git(["init", "-q"], work)
    git(["add", "-A"], work)
    git(["commit", "-q", "-m", "upstream 1.8.6"], work)
    patch_dir = root / "patches"
    patch_dir.mkdir(parents=True)
    for p in patches:
        p["edit"](work)
        git(["add", "-A"], work)
        message = (
            f"{p['subject']}\n\n{p.get('body', BODY)}\n\n"
            + (f"Bug: {p['bug']}\n" if p.get("bug") else "")
            + f"Forwarded: no\nOrigin: vendor\nKind: {p['kind']}\n"
        )
        git(["commit", "-q", "-F", "-"], work, input=message)
        text = git(["format-patch", "-1", "--stdout", "--no-signature", "--zero-commit", "--full-index"], work)
        (patch_dir / p["name"]).write_text(text)
    (patch_dir / "series").write_text("".join(p["name"] + "\n" for p in patches))
    (root / "upstream.lock").write_text(common.LOCK_FILE.read_text())
    shutil.rmtree(work)
    return root


def append(path: str, text: str) -> Edit:
    def edit(work: Path) -> None:
        with open(work / path, "a") as f:
            f.write(text)
    return edit


def replace(path: str, old: str, new: str) -> Edit:
    def edit(work: Path) -> None:
        target = work / path
        content = target.read_text()
        assert old in content, f"{old!r} not in {path}"
        target.write_text(content.replace(old, new, 1))
    return edit


def remove(path: str) -> Edit:
    def edit(work: Path) -> None:
        (work / path).unlink()
    return edit


def combine(*edits: Edit) -> Edit:
    def edit(work: Path) -> None:
        for e in edits:
            e(work)
    return edit


def materialize(queue: Path, dest: Optional[Path] = None, upto: Optional[str] = None) -> Path:
    return tree.materialize(dest or queue / "src", upto=upto, lock_file=queue / "upstream.lock",
                            patch_dir=queue / "patches", quiet=True)


def touched_files(patch_texts: Sequence[str]) -> List[str]:
    """The ``src/...`` paths the patches' diffs touch (either side), in first-seen order."""
    import re

    seen: List[str] = []
    for text in patch_texts:
        for a, b in re.findall(r"^diff --git a/(\S+) b/(\S+)$", text, flags=re.M):
            for path in (a, b):
                if path.startswith("src/") and path not in seen:
                    seen.append(path)
    return seen
