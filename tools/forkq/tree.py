"""Materialize upstream 1.8.6 plus the series into ``src/``: apply the patches, swap the new tree in atomically
(under a lock, with SIGINT/SIGTERM/SIGHUP handled), stamp what was built and give the tree its version
(``.partial`` for a prefix of the series, ``.dirty`` once files were edited by hand). Standard library, pip and git
only: ``setup.py`` runs this inside pip's isolated build environment."""
import contextlib
import ctypes
import errno
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from . import common
from .common import (LOCK_TIMEOUT_DEFAULT, LOCK_TIMEOUT_ENV, PACKAGES, UPSTREAM_TESTS, ForkError, Terminated, git,
                     seconds_from_env, unwritable)
from .seriesfile import read_series, resolve_upto
from .upstream import fetch_wheel, read_lock, sha256_file, unpack_packages

try:
    import fcntl
except ImportError:  # not POSIX: no lock between concurrent runs (the fork targets Linux TPU VMs)
    fcntl = None

STAMP_NAME = ".fork-stamp.json"
STAGING_PREFIX = ".fork-staging-"


def series_digest(patch_names: Sequence[str], lock: Dict, patch_dir: Optional[Path] = None) -> str:
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    h = hashlib.sha256()
    h.update(json.dumps(lock, sort_keys=True).encode())
    for name in patch_names:
        h.update(name.encode() + b"\0")
        h.update((patch_dir / name).read_bytes())
    return h.hexdigest()


def fork_version(lock: Optional[Dict] = None, series: Optional[List[str]] = None,
                 patch_dir: Optional[Path] = None) -> str:
    """PEP 440 version of the fork: ``<upstream>+xla.<number of patches>.g<digest of the series>``."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    lock = read_lock() if lock is None else lock
    series = read_series(patch_dir / "series") if series is None else series
    upstream = lock["pytorch-lightning"]["version"]
    return f"{upstream}+xla.{len(series)}.g{series_digest(series, lock, patch_dir)[:8]}"



def apply_patch(tree: Path, patch: Path) -> None:
    """Apply one patch's ``src/`` changes with ``git apply`` (no fuzz, all or nothing).

    The sections of a patch under ``tests/`` update upstream's own test files (see :func:`split_diff`); the wheel
    the tree is made from has no tests, so they are left out here.
    """
    proc = git(["apply", "--whitespace=nowarn", f"--exclude={UPSTREAM_TESTS}*", str(patch)], cwd=tree, check=False)
    if proc.returncode != 0:
        hunks = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        raise ForkError(
            f"patch {patch.name} does not apply to upstream plus the patches before it.\n"
            + "\n".join(hunks or proc.stderr.splitlines())
            + f"\nRegenerate it: `make fork UPTO=<the patch before it>`, redo the change in src/, "
            f"then `make refresh PATCH={patch.name}`."
        )


def build_tree(dest_root: Path, patch_names: Sequence[str], lock: Dict, patch_dir: Optional[Path] = None,
               cache_dir: Optional[Path] = None) -> None:
    """Write upstream plus ``patch_names`` to ``dest_root/src`` (``dest_root`` must be new)."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    cache_dir = common.CACHE_DIR if cache_dir is None else cache_dir
    dest_root.mkdir(parents=True)
    wheel = fetch_wheel("pytorch-lightning", lock["pytorch-lightning"], cache_dir)
    unpack_packages(wheel, dest_root / "src")
    git(["init", "-q"], cwd=dest_root)
    for name in patch_names:
        apply_patch(dest_root, patch_dir / name)
    shutil.rmtree(dest_root / ".git")


VERSION_FILES = tuple(f"{pkg}/__version__.py" for pkg in PACKAGES)


def write_version(src: Path, version: str) -> None:
    for pkg in PACKAGES:
        try:
            (src / pkg / "__version__.py").write_text(f'version = "{version}"\n')
        except OSError as err:
            raise unwritable(src / pkg, err)


def tree_manifest(src: Path) -> Dict[str, str]:
    """``{path relative to src: sha256}`` of every file of the packages in ``src``, without byte-code caches and
    the version files (the tool's bookkeeping, rewritten by every run)."""
    files: Dict[str, str] = {}
    for pkg in PACKAGES:
        for path in sorted((src / pkg).rglob("*")):
            rel = path.relative_to(src)
            if "__pycache__" in rel.parts or path.suffix == ".pyc" or rel.as_posix() in VERSION_FILES:
                continue
            if path.is_file():
                files[rel.as_posix()] = sha256_file(path)
    return files


def local_edits(src: Path, stamp: Optional[Dict] = None) -> List[str]:
    """What differs in ``src`` from the tree its stamp records ("modified: path", "added: path",
    "removed: path"); empty when ``src`` is exactly what the tool wrote."""
    stamp = read_stamp(src) if stamp is None else stamp
    if stamp is None or not isinstance(stamp.get("files"), dict):
        raise ForkError(f"{src} has no stamp with file hashes: run `python3 tools/fork.py materialize --force`")
    recorded, actual = stamp["files"], tree_manifest(src)
    edits = [f"modified: {p}" for p in sorted(set(recorded) & set(actual)) if recorded[p] != actual[p]]
    edits += [f"added: {p}" for p in sorted(set(actual) - set(recorded))]
    edits += [f"removed: {p}" for p in sorted(set(recorded) - set(actual))]
    return edits


def dirty_version(version: str) -> str:
    """The version of a tree with local edits: never the canonical string of the series."""
    return f"{version}.dirty"


def tree_version(src: Path) -> str:
    """The version ``src`` ships under: its stamp's version, marked ``.dirty`` when files were edited since the
    tool wrote it. Raises ForkError when ``src`` was not materialized by this tool."""
    stamp = read_stamp(src)
    if stamp is None:
        raise ForkError(f"{src} was not materialized by tools/fork.py; run `make fork` first")
    return dirty_version(stamp["version"]) if local_edits(src, stamp) else stamp["version"]


def settle_version(src: Path) -> str:
    """``tree_version(src)``, also written into the packages' version files when they say otherwise (a file was
    edited, or an edit undone, since the last run): what a build of ``src`` ships must say what ``src`` is."""
    version = tree_version(src)
    if any(_read(src / f) != f'version = "{version}"\n' for f in VERSION_FILES):
        write_version(src, version)
    return version


def _stamp(names: List[str], series: List[str], lock: Dict, patch_dir: Path) -> Dict:
    """What a tree holding upstream plus ``names`` records about itself: digest, patches and version. A tree with
    only part of the series gets a ``.partial`` version of its own."""
    digest = series_digest(names, lock, patch_dir)
    complete = names == series
    version = fork_version(lock, series, patch_dir) if complete else (
        f"{lock['pytorch-lightning']['version']}+xla.{len(names)}.g{digest[:8]}.partial")
    return {"digest": digest, "patches": names, "upto": names[-1] if names else None, "complete": complete,
            "version": version}


def write_stamp(src: Path, stamp: Dict) -> None:
    """Record ``stamp`` plus the hash of every file now in ``src`` (so later edits are detected)."""
    stamp = dict(stamp, files=tree_manifest(src))
    (src / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n")


def _format_edits(edits: Sequence[str], limit: int = 10) -> str:
    shown = "\n  ".join(edits[:limit])
    more = f"\n  ... and {len(edits) - limit} more" if len(edits) > limit else ""
    return f"  {shown}{more}"


# --------------------------------------------------------------------------------------------- safe writing
@contextlib.contextmanager
def _exclusive(dest: Path, timeout: float) -> Iterator[None]:
    """Hold the lock of ``dest`` (a file next to it): one materialize per destination at a time. Waits up to
    ``timeout`` seconds for another run, saying so, and then fails with a message naming it."""
    lock_path = dest.parent / f".fork-{dest.name}.lock"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise unwritable(dest.parent, err)
    try:
        if fcntl is not None:
            deadline = time.monotonic() + timeout
            waiting = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                    if not waiting:
                        print(f"fork.py: another `fork.py materialize` (pid {holder}) is writing {dest}; waiting up "
                              f"to {timeout:.0f} s for it to finish ({LOCK_TIMEOUT_ENV})", file=sys.stderr, flush=True)
                        waiting = True
                    if time.monotonic() >= deadline:
                        raise ForkError(
                            f"another `fork.py materialize` (pid {holder}) is still writing {dest} after {timeout:.0f} s "
                            f"of waiting. Let it finish and run again, or, if it hangs, stop it (`kill {holder}`); "
                            f"the lock is {lock_path}, released when that process ends."
                        )
                    time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock; the file stays (removing it would race with a waiter)


@contextlib.contextmanager
def _terminate_as_exception() -> Iterator[None]:
    """While a tree is built, SIGTERM and SIGHUP raise Terminated (as Ctrl-C raises KeyboardInterrupt), so the
    ``finally`` blocks that remove the staging folder run. Only the main thread can install handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(signum)

    wanted = [getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n)]
    previous = {s: signal.signal(s, handler) for s in wanted}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``, macOS ``renamex_np(RENAME_SWAP)``).
    False when this system or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    fa, fb = os.fsencode(str(a)), os.fsencode(str(b))
    if hasattr(libc, "renameat2"):
        at_fdcwd, rename_exchange = -100, 2
        result = libc.renameat2(at_fdcwd, fa, at_fdcwd, fb, rename_exchange)
    elif hasattr(libc, "renamex_np"):
        result = libc.renamex_np(fa, fb, 2)  # RENAME_SWAP
    else:
        return False
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, getattr(errno, "ENOTSUP", errno.EINVAL), errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap_in(new: Path, dest: Path, trash: Path) -> None:
    """Make ``new`` the tree at ``dest`` without a moment in which ``dest`` is missing; the old tree ends up at
    ``new`` or ``trash`` (both inside the staging folder)."""
    if not dest.exists():
        os.replace(new, dest)
    elif not _exchange(new, dest):
        print(f"fork.py: warning: this file system cannot swap two folders atomically; {dest} is replaced with two "
              "renames and is missing for a moment in between", file=sys.stderr)
        os.replace(dest, trash)
        os.replace(new, dest)


def _clean_stale_staging(dest: Path) -> None:
    """Remove staging folders of ``dest`` that a killed run (SIGKILL, power loss) left; called under the lock."""
    for stale in dest.parent.glob(f"{STAGING_PREFIX}{dest.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def materialize(dest: Optional[Path] = None, upto: Optional[str] = None, force: bool = False,
                lock_file: Optional[Path] = None, patch_dir: Optional[Path] = None, cache_dir: Optional[Path] = None,
                quiet: bool = False, lock_timeout: Optional[float] = None) -> Path:
    """Make ``dest`` hold upstream plus the series (or its prefix up to ``upto``).

    The tree is built in a staging folder next to ``dest`` and swapped in atomically only once every patch
    applied, so a failure or an interrupt (Ctrl-C, SIGTERM) never leaves a half-patched tree behind and ``dest``
    never disappears. One run per ``dest`` at a time (a lock; a second run waits up to ``lock_timeout`` s,
    FORK_LOCK_TIMEOUT). A stamp records what was built and the hash of every file: when it matches the series,
    nothing is rebuilt; files edited since then mark the version ``.dirty``; a tree with edits is never replaced
    unless ``force`` (``make refresh`` is how edits become a patch).
    """
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    cache_dir = common.CACHE_DIR if cache_dir is None else cache_dir
    dest = common.ROOT / "src" if dest is None else dest
    lock = read_lock(lock_file)
    series = read_series(patch_dir / "series")
    names = resolve_upto(series, upto)
    stamp = _stamp(names, series, lock, patch_dir)
    dest = Path(dest).resolve()
    if not force and _settle_current(dest, stamp, quiet, writable=False):
        return dest
    timeout = seconds_from_env(LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_DEFAULT) if lock_timeout is None else lock_timeout
    with _terminate_as_exception(), _exclusive(dest, timeout):
        if not force and _settle_current(dest, stamp, quiet, writable=True):
            return dest  # another run built it while this one waited, or only the version files needed writing
        _clean_stale_staging(dest)
        try:
            staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{dest.name}-", dir=dest.parent))
        except OSError as err:
            raise unwritable(dest.parent, err)
        try:
            build_tree(staging / "root", names, lock, patch_dir, cache_dir)
            new_src = staging / "root" / "src"
            write_version(new_src, stamp["version"])
            write_stamp(new_src, stamp)
            _swap_in(new_src, dest, staging / "old")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    if not quiet:
        print(f"{dest}: upstream {lock['pytorch-lightning']['version']} + {len(names)} patches ({stamp['version']})")
    return dest


def _settle_current(dest: Path, stamp: Dict, quiet: bool, writable: bool) -> bool:
    """True when ``dest`` already holds the tree of ``stamp`` (its version files then say whether it was edited).
    Raises ForkError when ``dest`` holds another tree with local edits, which a rebuild would destroy."""
    current = read_stamp(dest)
    if current is None:
        # setuptools leaves <name>.egg-info in src/ (an sdist ships one there): that is not a tree to protect
        if dest.exists() and (not dest.is_dir() or any(not e.name.endswith(".egg-info") for e in dest.iterdir())):
            raise ForkError(f"{dest} exists but was not written by `fork.py materialize` (it has no {STAMP_NAME}); "
                            "refusing to replace it. Move it away or pick another --dest (--force replaces it).")
        return False
    if not isinstance(current.get("files"), dict):
        return False  # written by an older fork.py, without file hashes: rebuilt
    edits = local_edits(dest, current)
    if current.get("digest") != stamp["digest"]:
        if edits:
            base = current.get("upto") or "upstream"
            raise ForkError(
                f"{dest} has local edits that rebuilding it for {stamp['upto'] or 'upstream'!r} would destroy:\n"
                f"{_format_edits(edits)}\n"
                f"To keep them, turn them into a patch first (`make refresh PATCH={base}`, or `make new-patch ...` "
                f"on the whole series); to throw them away, run again with --force (`make fork FORCE=1`)."
            )
        return False
    version = dirty_version(stamp["version"]) if edits else stamp["version"]
    wrong = [f for f in VERSION_FILES if _read(dest / f) != f'version = "{version}"\n']
    if wrong:
        if not writable:
            return False  # the version files must be written: under the lock
        write_version(dest, version)
    if edits:
        print(f"fork.py: warning: {dest} differs from upstream plus its patches in {len(edits)} file(s); its "
              f"version is marked {version}, never the series' own:\n{_format_edits(edits)}\n"
              f"Turn the edits into a patch (`make refresh PATCH=...`) or discard them (`make fork FORCE=1`).",
              file=sys.stderr)
    elif not quiet:
        print(f"{dest}: up to date ({len(stamp['patches'])} patches, {version})")
    return True


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text()
    except OSError:
        return None


def read_stamp(src: Path) -> Optional[Dict]:
    try:
        return json.loads((src / STAMP_NAME).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None

