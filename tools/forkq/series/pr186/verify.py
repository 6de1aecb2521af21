"""The repository standing for upstream's tag 1.8.6 (the pinned wheel's packages are the tag's ``src/``), and the
check of an exported series: ``git am`` takes it there, and every source file it touches equals the tree
materialized from a queue holding only the fix patches."""
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ... import common
from ...common import ForkError, commit, git
from ...patchfile import Patch, touched_files
from ...seriesfile import read_series
from ...tree import materialize
from ...upstream import fetch_wheel, read_lock, unpack_packages

BASE_DATE = "2022-12-21T00:00:00+0000"  # the commit standing for tag 1.8.6 in the verification repository


def upstream_repo(dest: Path, lock: Dict, cache_dir: Path) -> Path:
    """A git repository holding upstream's ``src/`` at 1.8.6 in one commit tagged ``1.8.6``."""
    dest.mkdir(parents=True)
    wheel = fetch_wheel("pytorch-lightning", lock["pytorch-lightning"], cache_dir)
    unpack_packages(wheel, dest / "src")
    git(["init", "-q"], cwd=dest)
    git(["add", "-A"], cwd=dest)
    commit(dest, "1.8.6", "upstream <upstream@localhost>", BASE_DATE)
    git(["tag", "1.8.6"], cwd=dest)
    return dest


def carried_test_files(fixes: Sequence[Patch]) -> List[str]:
    """Upstream's test files the fixes update (their ``tests/`` sections); the tree made from the wheel lacks them,
    so the checks on it leave them out, and ``check-tag`` applies them to the tag's files."""
    return sorted({f for fix in fixes for f in touched_files(fix.tests_diff, tree="tests")})


def excludes(paths: Sequence[str]) -> List[str]:
    return [f"--exclude={path}" for path in paths]


def verify(mboxes: Sequence[Path], patch_dir: Optional[Path] = None, lock_file: Optional[Path] = None,
           cache_dir: Optional[Path] = None) -> Path:
    """``git am`` the series on upstream 1.8.6 and compare each touched source file with upstream + fixes only."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    lock = read_lock(lock_file)
    fixes = [n for n in read_series(patch_dir / "series") if Patch.read(patch_dir / n).kind == "fix"]
    carried = carried_test_files([Patch.read(patch_dir / n) for n in fixes])
    with tempfile.TemporaryDirectory() as tmp:
        repo = upstream_repo(Path(tmp) / "upstream", lock, cache_dir)
        for mbox in mboxes:
            # upstream's test files are not in the wheel's tree; `check-tag` applies their updates to the tag
            proc = git(["am", "-q", "--whitespace=nowarn", *excludes(carried), str(mbox)], cwd=repo, check=False)
            if proc.returncode != 0:
                raise ForkError(f"git am {mbox.name} failed on upstream 1.8.6:\n{proc.stdout}{proc.stderr}")
        queue = Path(tmp) / "fixes-only"
        queue.mkdir()
        for name in fixes:
            shutil.copy2(patch_dir / name, queue / name)
        (queue / "series").write_text("".join(n + "\n" for n in fixes))
        src = materialize(Path(tmp) / "fixes-src" / "src", lock_file=lock_file, patch_dir=queue,
                               cache_dir=cache_dir, quiet=True)
        touched = {f for m in mboxes for f in touched_files(m.read_text(), tree="src") if f.startswith("src/")}
        for path in sorted(touched):
            ours, theirs = src.parent / path, repo / path
            if ours.exists() != theirs.exists() or (ours.exists() and ours.read_bytes() != theirs.read_bytes()):
                raise ForkError(f"{path} after git am differs from upstream + the fix patches")
    return patch_dir


