#!/usr/bin/env python3
"""The fork tool: materialize upstream Lightning 1.8.6 plus this repository's patch queue.

Only the standard library, pip and git are used, so the tool also runs inside pip's isolated build
environment (``setup.py`` calls it when ``src/`` is missing).

Commands::

    fork.py materialize [--upto NAME] [--dest DIR] [--force]
    fork.py check
    fork.py refresh NAME
    fork.py restat NAME
    fork.py new NAME --subject S --kind compat|fix|feature --bug URL --forwarded yes|no|not-needed [--body-file F]
    fork.py version
    fork.py readme [--check]
    fork.py list

The layout of every materialized tree is the layout of upstream's git tag ``1.8.6``: ``src/pytorch_lightning``
and ``src/lightning_lite``. Patches are ``git format-patch`` files against that tag, listed in order in
``patches/series``. A patch that changes upstream behaviour on purpose also updates upstream's tests of it: its
sections under ``tests/`` are diffs against the tag's test files, skipped by materialize (see ``split_diff``).
"""
import argparse
import contextlib
import ctypes
import email.utils
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

try:
    import fcntl
except ImportError:  # not POSIX: no lock between concurrent runs (the fork targets Linux TPU VMs)
    fcntl = None

ROOT = Path(__file__).resolve().parent.parent
LOCK_FILE = ROOT / "upstream.lock"
PATCH_DIR = ROOT / "patches"
SERIES_FILE = PATCH_DIR / "series"
CACHE_DIR = ROOT / ".cache" / "upstream"
STAMP_NAME = ".fork-stamp.json"
STAGING_PREFIX = ".fork-staging-"
RUNTIME_REQUIREMENTS = ROOT / "requirements" / "runtime.txt"
README = ROOT / "README.md"
# seconds; both can be changed through the environment
LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_DEFAULT = "FORK_LOCK_TIMEOUT", 600.0
DOWNLOAD_TIMEOUT_ENV, DOWNLOAD_TIMEOUT_DEFAULT = "FORK_DOWNLOAD_TIMEOUT", 600.0
PIP = [sys.executable, "-m", "pip"]
PACKAGES = ("pytorch_lightning", "lightning_lite")
# compat patches port 1.8.6 to the current stack, fix patches are the upstream fixes, feature patches add what upstream
# never had (the SPMD strategies); the series keeps them in that order
KINDS = ("compat", "fix", "feature")
FORWARDED = ("yes", "no", "not-needed")
REQUIRED_TRAILERS = ("Forwarded", "Origin", "Kind")  # Bug: a URL, or absent
AUTHOR = "Lightning XLA fork <lightning-xla-fork@users.noreply.github.com>"
# a patch's sections under this path update upstream's own tests (tag 1.8.6's ``tests/``), see split_diff
UPSTREAM_TESTS = "tests/"


class ForkError(Exception):
    """A problem the user has to fix; printed without a traceback."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived while a tree was being built (raised so that the staging folder is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _seconds_from_env(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ForkError(f"{name}={raw!r} is not a number of seconds greater than 0")
    return value


def _unwritable(path: Path, err: OSError) -> ForkError:
    """The error for a folder that materialize has to write to and cannot (read-only checkout, permissions)."""
    why = "it is on a read-only file system" if err.errno == errno.EROFS else (err.strerror or str(err))
    return ForkError(
        f"cannot write to {path}: {why}. `fork.py materialize` writes the generated tree next to it "
        f"(a staging folder, then the swap), a lock file, and the download cache (--cache-dir, by default "
        f".cache/upstream in the checkout). In a read-only "
        f"checkout, write the tree elsewhere: `python3 tools/fork.py materialize --dest /some/writable/src "
        f"--cache-dir /some/writable/cache`, or make the checkout writable."
    )


# --------------------------------------------------------------------------------------------- lock & series
def read_lock(lock_file: Optional[Path] = None) -> Dict[str, Dict[str, str]]:
    """Return ``{distribution: {"version": ..., "sha256": ..., "filename": ...}}`` from the lock file."""
    lock_file = LOCK_FILE if lock_file is None else lock_file
    try:
        data = json.loads(lock_file.read_text())
    except FileNotFoundError:
        raise ForkError(f"lock file {lock_file} is missing")
    except json.JSONDecodeError as err:
        raise ForkError(f"lock file {lock_file} is not valid JSON: {err}")
    for dist, entry in data.items():
        for key in ("version", "sha256", "filename"):
            if key not in entry:
                raise ForkError(f"lock file {lock_file}: entry {dist!r} lacks {key!r}")
        if not re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]):
            raise ForkError(f"lock file {lock_file}: entry {dist!r} has a malformed sha256 {entry['sha256']!r}")
    return data


def read_series(series_file: Optional[Path] = None) -> List[str]:
    """The patch names of the series, in order; blank lines and ``#`` comments are ignored."""
    series_file = SERIES_FILE if series_file is None else series_file
    if not series_file.exists():
        return []
    names = []
    for line in series_file.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    if len(set(names)) != len(names):
        raise ForkError(f"{series_file} names a patch twice")
    for name in names:
        if not (series_file.parent / name).is_file():
            raise ForkError(f"{series_file} names {name!r}, but {series_file.parent / name} does not exist")
    return names


def resolve_upto(series: Sequence[str], upto: Optional[str]) -> List[str]:
    """The prefix of ``series`` that ends with ``upto`` (a file name, or its number prefix such as ``0003``)."""
    if upto is None:
        return list(series)
    if upto in ("", "0", "none", "upstream"):
        return []
    matches = [i for i, name in enumerate(series) if name == upto or name.split("-", 1)[0] == upto]
    if len(matches) != 1:
        raise ForkError(f"--upto {upto!r} matches no single patch of the series; the series is: {', '.join(series)}")
    return list(series[: matches[0] + 1])


def series_digest(patch_names: Sequence[str], lock: Dict, patch_dir: Path = PATCH_DIR) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(lock, sort_keys=True).encode())
    for name in patch_names:
        h.update(name.encode() + b"\0")
        h.update((patch_dir / name).read_bytes())
    return h.hexdigest()


def fork_version(lock: Optional[Dict] = None, series: Optional[List[str]] = None,
                 patch_dir: Path = PATCH_DIR) -> str:
    """PEP 440 version of the fork: ``<upstream>+xla.<number of patches>.g<digest of the series>``."""
    lock = read_lock() if lock is None else lock
    series = read_series(patch_dir / "series") if series is None else series
    upstream = lock["pytorch-lightning"]["version"]
    return f"{upstream}+xla.{len(series)}.g{series_digest(series, lock, patch_dir)[:8]}"


# --------------------------------------------------------------------------------------------- runtime pins
def runtime_pins(path: Optional[Path] = None) -> Dict[str, str]:
    """``{name: version}`` of the ``name==version`` lines of requirements/runtime.txt (names as written)."""
    path = RUNTIME_REQUIREMENTS if path is None else path
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ForkError(f"{path} is missing: it pins torch and torch_xla for the package metadata")
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([0-9][^\s;]*)", line)
        if m:
            pins[m.group(1)] = m.group(2)
    return pins


def python_range(path: Optional[Path] = None):
    """The Pythons and the platform with wheels of the pinned torch and torch_xla, as ``requirements/runtime.txt``
    states them (parsed by ``tools/check_python.py``, which ``make`` runs before it builds ``.venv``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fork_check_python", Path(__file__).with_name("check_python.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        return module.read_range(RUNTIME_REQUIREMENTS if path is None else path)
    except (OSError, ValueError) as err:
        raise ForkError(str(err))


def torch_requirements(path: Optional[Path] = None) -> Dict[str, List[str]]:
    """The requirements that keep torch and torch_xla matched, from the pins of requirements/runtime.txt.

    A torch_xla release works only with the torch release of the same minor version, and torch_xla declares no
    dependency on torch; so every package of the fork pins torch to that minor (``install_requires``), and the
    extras add torch_xla itself: ``xla`` (any host) and ``tpu`` (with libtpu, for a Cloud TPU VM).
    """
    path = RUNTIME_REQUIREMENTS if path is None else path
    pins = runtime_pins(path)
    missing = [n for n in ("torch", "torch_xla") if n not in pins]
    if missing:
        raise ForkError(f"{path} must pin {' and '.join(missing)} with `==`")
    xla_minor = re.match(r"(\d+)\.(\d+)", pins["torch_xla"])
    torch_minor = re.match(r"(\d+)\.(\d+)", pins["torch"])
    if not xla_minor or not torch_minor or xla_minor.groups() != torch_minor.groups():
        raise ForkError(f"{path}: torch=={pins['torch']} and torch_xla=={pins['torch_xla']} must share a minor version")
    major, minor = map(int, xla_minor.groups())
    torch = f"torch>={major}.{minor}.0,<{major}.{minor + 1}"
    return {
        "install_requires": [torch],
        "xla": [torch, f"torch_xla=={pins['torch_xla']}"],
        "tpu": [torch, f"torch_xla[tpu]=={pins['torch_xla']}"],
    }


# --------------------------------------------------------------------------------------------- upstream wheel
def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run_pip_download(cmd: List[str], what: str, timeout: float) -> "tuple[int, str]":
    """Run ``cmd`` (a pip download), echo its output line by line to stderr as progress, give up after
    ``timeout`` seconds. Returns pip's exit code and output; raises ForkError on timeout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: List[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            sys.stderr.write(f"  pip: {line}" if line.strip() else line)
            sys.stderr.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(5)
        raise ForkError(
            f"the download of {what} did not finish within {timeout:.0f} s, so it was stopped. Check the network "
            f"and pip's index settings (PIP_INDEX_URL, a proxy), then run again; on a slow link raise the limit with "
            f"{DOWNLOAD_TIMEOUT_ENV}=<seconds>. pip said:\n{''.join(lines[-20:])}"
        )
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    reader.join(5)
    return proc.returncode, "".join(lines)


def fetch_wheel(dist: str, entry: Dict[str, str], cache_dir: Path = CACHE_DIR, timeout: Optional[float] = None) -> Path:
    """Download the pinned wheel through pip (once) and check its sha256 against the lock.

    pip's output is shown as progress on stderr, and the download is stopped after ``timeout`` seconds
    (default: FORK_DOWNLOAD_TIMEOUT, else 600)."""
    wheel = cache_dir / entry["filename"]
    if not wheel.exists():
        timeout = _seconds_from_env(DOWNLOAD_TIMEOUT_ENV, DOWNLOAD_TIMEOUT_DEFAULT) if timeout is None else timeout
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp_ctx = tempfile.TemporaryDirectory(dir=cache_dir)
        except OSError as err:
            raise _unwritable(cache_dir, err)
        what = f"{dist}=={entry['version']}"
        print(f"fork.py: downloading {what} with pip (pinned in upstream.lock, sha256 checked; "
              f"stopped after {timeout:.0f} s, {DOWNLOAD_TIMEOUT_ENV})", file=sys.stderr, flush=True)
        started = time.monotonic()
        with tmp_ctx as tmp:
            cmd = [
                *PIP, "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
                "--progress-bar", "off", "--timeout", str(max(1, min(int(timeout), 60))), "-d", tmp, what,
            ]
            code, output = _run_pip_download(cmd, what, timeout)
            got = Path(tmp) / entry["filename"]
            if code != 0 or not got.exists():
                raise ForkError(f"could not download {what} with pip (exit {code}):\n{output}")
            os.replace(got, wheel)
        print(f"fork.py: downloaded {wheel.name} ({wheel.stat().st_size // 1024} KiB) in "
              f"{time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    actual = sha256_file(wheel)
    if actual != entry["sha256"]:
        raise ForkError(
            f"sha256 mismatch for {wheel.name}: the lock file pins {entry['sha256']} but the file has {actual}. "
            f"Nothing was materialized. If the lock is right, delete {wheel} and run again; "
            "never edit the lock to match an unexpected download."
        )
    return wheel


def unpack_packages(wheel: Path, dest_src: Path, packages: Sequence[str] = PACKAGES) -> None:
    """Extract the top-level ``packages`` of ``wheel`` into ``dest_src``."""
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.split("/", 1)[0] in packages]
        missing = [p for p in packages if not any(m.startswith(p + "/") for m in members)]
        if missing:
            raise ForkError(f"{wheel.name} does not contain {missing}")
        for member in members:
            zf.extract(member, dest_src)


# --------------------------------------------------------------------------------------------- applying
def _git(args: Sequence[str], cwd: Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # never let an enclosing repository (ours) capture the paths of a staging tree
    env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    env.setdefault("GIT_AUTHOR_NAME", "fork")
    env.setdefault("GIT_AUTHOR_EMAIL", "fork@localhost")
    env.setdefault("GIT_COMMITTER_NAME", "fork")
    env.setdefault("GIT_COMMITTER_EMAIL", "fork@localhost")
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, **kw)
    if check and proc.returncode != 0:
        raise ForkError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc


def apply_patch(tree: Path, patch: Path) -> None:
    """Apply one patch's ``src/`` changes with ``git apply`` (no fuzz, all or nothing).

    The sections of a patch under ``tests/`` update upstream's own test files (see :func:`split_diff`); the wheel
    the tree is made from has no tests, so they are left out here.
    """
    proc = _git(["apply", "--whitespace=nowarn", f"--exclude={UPSTREAM_TESTS}*", str(patch)], cwd=tree, check=False)
    if proc.returncode != 0:
        hunks = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        raise ForkError(
            f"patch {patch.name} does not apply to upstream plus the patches before it.\n"
            + "\n".join(hunks or proc.stderr.splitlines())
            + f"\nRegenerate it: `make fork UPTO=<the patch before it>`, redo the change in src/, "
            f"then `make refresh PATCH={patch.name}`."
        )


def build_tree(dest_root: Path, patch_names: Sequence[str], lock: Dict, patch_dir: Path = PATCH_DIR,
               cache_dir: Path = CACHE_DIR) -> None:
    """Write upstream plus ``patch_names`` to ``dest_root/src`` (``dest_root`` must be new)."""
    dest_root.mkdir(parents=True)
    wheel = fetch_wheel("pytorch-lightning", lock["pytorch-lightning"], cache_dir)
    unpack_packages(wheel, dest_root / "src")
    _git(["init", "-q"], cwd=dest_root)
    for name in patch_names:
        apply_patch(dest_root, patch_dir / name)
    shutil.rmtree(dest_root / ".git")


VERSION_FILES = tuple(f"{pkg}/__version__.py" for pkg in PACKAGES)


def write_version(src: Path, version: str) -> None:
    for pkg in PACKAGES:
        try:
            (src / pkg / "__version__.py").write_text(f'version = "{version}"\n')
        except OSError as err:
            raise _unwritable(src / pkg, err)


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
        raise _unwritable(dest.parent, err)
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


def materialize(dest: Path = ROOT / "src", upto: Optional[str] = None, force: bool = False,
                lock_file: Optional[Path] = None, patch_dir: Path = PATCH_DIR, cache_dir: Path = CACHE_DIR,
                quiet: bool = False, lock_timeout: Optional[float] = None) -> Path:
    """Make ``dest`` hold upstream plus the series (or its prefix up to ``upto``).

    The tree is built in a staging folder next to ``dest`` and swapped in atomically only once every patch
    applied, so a failure or an interrupt (Ctrl-C, SIGTERM) never leaves a half-patched tree behind and ``dest``
    never disappears. One run per ``dest`` at a time (a lock; a second run waits up to ``lock_timeout`` s,
    FORK_LOCK_TIMEOUT). A stamp records what was built and the hash of every file: when it matches the series,
    nothing is rebuilt; files edited since then mark the version ``.dirty``; a tree with edits is never replaced
    unless ``force`` (``make refresh`` is how edits become a patch).
    """
    lock = read_lock(lock_file)
    series = read_series(patch_dir / "series")
    names = resolve_upto(series, upto)
    stamp = _stamp(names, series, lock, patch_dir)
    dest = Path(dest).resolve()
    if not force and _settle_current(dest, stamp, quiet, writable=False):
        return dest
    timeout = _seconds_from_env(LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_DEFAULT) if lock_timeout is None else lock_timeout
    with _terminate_as_exception(), _exclusive(dest, timeout):
        if not force and _settle_current(dest, stamp, quiet, writable=True):
            return dest  # another run built it while this one waited, or only the version files needed writing
        _clean_stale_staging(dest)
        try:
            staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{dest.name}-", dir=dest.parent))
        except OSError as err:
            raise _unwritable(dest.parent, err)
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


# --------------------------------------------------------------------------------------------- patch headers
def parse_patch(text: str) -> Dict[str, object]:
    """Split a format-patch file into its header fields, message body, trailers and diff."""
    m = re.search(r"^---\n|^diff --git ", text, flags=re.M)
    if not m:
        raise ForkError("no diff found")
    head, diff = text[: m.start()], text[m.start():]
    if diff.startswith("---\n"):
        # skip the diffstat
        d = re.search(r"^diff --git ", diff, flags=re.M)
        diff = diff[d.start():] if d else ""
    headers: Dict[str, str] = {}
    lines = head.splitlines()
    i = 0
    if lines and lines[0].startswith("From "):
        headers["From_"] = lines[0]
        i = 1
    while i < len(lines) and lines[i].strip():
        key, _, value = lines[i].partition(":")
        i += 1
        while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
            value += " " + lines[i].strip()
            i += 1
        headers[key.strip()] = value.strip()
    message = "\n".join(lines[i:]).strip("\n")
    trailers: Dict[str, str] = {}
    body_lines = message.splitlines()
    while body_lines and re.match(r"^[A-Z][A-Za-z-]*: ", body_lines[-1]):
        key, _, value = body_lines.pop().partition(": ")
        trailers[key] = value.strip()
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", headers.get("Subject", ""))
    return {"headers": headers, "subject": subject, "body": "\n".join(body_lines).strip("\n"),
            "trailers": dict(reversed(list(trailers.items()))), "diff": diff}


def touched_files(diff: str, tree: Optional[str] = None) -> List[str]:
    """The paths a diff changes, old and new names, in order of appearance.

    ``tree="src"`` keeps the paths of the generated packages (what materialize applies), ``tree="tests"`` those of
    upstream's own test files (what a patch updates in upstream's ``tests/``), ``None`` every path.
    """
    seen: List[str] = []
    for a, b in re.findall(r"^diff --git a/(\S+) b/(\S+)$", diff, flags=re.M):
        for path in (a, b):
            if path in seen:
                continue
            if tree == "tests" and not path.startswith(UPSTREAM_TESTS):
                continue
            if tree == "src" and path.startswith(UPSTREAM_TESTS):
                continue
            seen.append(path)
    return seen


def _diff_sections(diff: str) -> List[str]:
    """The per-file sections of a diff (each starts with ``diff --git``); text before the first is dropped."""
    starts = [m.start() for m in re.finditer(r"^diff --git ", diff, flags=re.M)]
    return [diff[a:b] for a, b in zip(starts, starts[1:] + [len(diff)])]


def _section_paths(section: str) -> "tuple[str, str]":
    m = re.match(r"diff --git a/(\S+) b/(\S+)$", section, flags=re.M)
    if not m:
        raise ForkError(f"malformed diff section: {section.splitlines()[0]!r}")
    return m.group(1), m.group(2)


def _is_test_section(section: str) -> bool:
    return any(p.startswith(UPSTREAM_TESTS) for p in _section_paths(section))


def split_diff(diff: str) -> "tuple[str, str]":
    """``(src part, tests part)`` of a patch's diff.

    A patch that changes behaviour on purpose updates upstream's tests of that behaviour in the same patch: its
    sections whose path starts with ``tests/`` are diffs against the files of upstream's tag ``1.8.6``
    (``tests/tests_pytorch/...``, ``tests/tests_lite/...``; their context lines are the tag's lines). Materialize
    skips them (the wheel has no tests), ``refresh`` carries them over unchanged, the PR series exports them, and
    ``tools/upstream_tests.py`` applies them to upstream's tests before it runs them.
    """
    src, tests = [], []
    for section in _diff_sections(diff):
        (tests if _is_test_section(section) else src).append(section)
    return "".join(src), "".join(tests)


def merge_diffs(first: str, second: str) -> str:
    """The sections of two diffs of different files, in git's order (by path)."""
    sections = _diff_sections(first) + _diff_sections(second)
    paths = [_section_paths(s)[1] for s in sections]
    if len(set(paths)) != len(paths):
        raise ForkError(f"two diffs change the same file: {sorted(p for p in paths if paths.count(p) > 1)}")
    sections = [s if s.endswith("\n") else s + "\n" for s in sections]
    return "".join(s for _, s in sorted(zip(paths, sections), key=lambda pair: pair[0]))


def _numstat(diff: str) -> List["tuple[int, int, str]"]:
    """``[(added, deleted, path)]`` of a diff, read by ``git apply --numstat`` (nothing is applied)."""
    with tempfile.TemporaryDirectory() as tmp:
        patch = Path(tmp) / "diff.patch"
        patch.write_text(diff)
        out = _git(["apply", "--numstat", "-z", str(patch)], cwd=Path(tmp)).stdout
    rows = []
    for record in out.split("\0"):
        if record.strip():
            added, deleted, path = record.split("\t", 2)
            rows.append((int(added), int(deleted), path))
    return rows


def diffstat(diff: str) -> str:
    """The diffstat ``git format-patch`` writes for ``diff`` (paths, bars, summary and the create/delete lines).

    git draws it from the paths and line counts alone, so it is drawn by ``git format-patch`` itself, from a
    throw-away commit whose files have the same paths and counts: a patch whose sections were put together
    (:func:`merge_diffs`) gets the stat git would have written for the whole diff.
    """
    created = {_section_paths(s)[1] for s in _diff_sections(diff) if re.search(r"^new file mode ", s, flags=re.M)}
    deleted = {_section_paths(s)[0] for s in _diff_sections(diff) if re.search(r"^deleted file mode ", s, flags=re.M)}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "stat"
        repo.mkdir()
        _git(["init", "-q"], cwd=repo)
        rows = _numstat(diff)
        for added, removed, path in rows:
            if path in created:
                continue
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text("".join(f"old {i}\n" for i in range(removed)) or "")
        _git(["add", "-A"], cwd=repo)
        _git(["commit", "-q", "--allow-empty", "-m", "before"], cwd=repo)
        for added, removed, path in rows:
            if path in deleted:
                (repo / path).unlink()
                continue
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text("".join(f"new {i}\n" for i in range(added)))
        _git(["add", "-A"], cwd=repo)
        _git(["commit", "-q", "--allow-empty", "-m", "after"], cwd=repo)
        out = _git(["format-patch", "-1", "--stdout", "--no-signature"], cwd=repo).stdout
    return re.search(r"^---\n(.*?\n)\n(?=diff --git )", out, flags=re.M | re.S).group(1)


def with_diff(patch_text: str, diff: str) -> str:
    """``patch_text`` (a format-patch file) with its diff replaced by ``diff`` and the diffstat redrawn for it."""
    m = re.search(r"^---\n", patch_text, flags=re.M)
    d = re.search(r"^diff --git ", patch_text, flags=re.M)
    if not m or not d or d.start() < m.start():
        raise ForkError("the patch has no `---` line and diffstat before its diff")
    return patch_text[: m.end()] + diffstat(diff) + "\n" + diff


def changelog_lines(diff: str) -> List[str]:
    """The lines a diff adds to CHANGELOG.md files, without blank lines and the ``-`` placeholder of an empty list."""
    lines, in_changelog = [], False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            in_changelog = line.endswith("CHANGELOG.md")
        elif in_changelog and line.startswith("+") and not line.startswith("+++") and line[1:].strip() not in ("", "-"):
            lines.append(line[1:])
    return lines


def validate_patch(path: Path) -> List[str]:
    """Problems with one patch's header; empty when it is complete."""
    problems = []
    try:
        info = parse_patch(path.read_text())
    except ForkError as err:
        return [f"{path.name}: {err}"]
    headers, trailers = info["headers"], info["trailers"]
    for key in ("From_", "From", "Date", "Subject"):
        if key not in headers:
            problems.append(f"{path.name}: header {key.rstrip('_')!r} missing")
    if not info["subject"]:
        problems.append(f"{path.name}: empty subject")
    if len(str(info["body"]).strip()) < 40:
        problems.append(f"{path.name}: the body must say what was wrong and why this fix")
    for key in REQUIRED_TRAILERS:
        if key not in trailers:
            problems.append(f"{path.name}: trailer {key!r} missing")
    if trailers.get("Kind") and trailers["Kind"] not in KINDS:
        problems.append(f"{path.name}: Kind must be one of {KINDS}, not {trailers['Kind']!r}")
    if trailers.get("Forwarded") and trailers["Forwarded"].split()[0] not in FORWARDED:
        problems.append(f"{path.name}: Forwarded must start with one of {FORWARDED}")
    if not info["diff"]:
        problems.append(f"{path.name}: no diff")
    _, tests_diff = split_diff(str(info["diff"])) if info["diff"] else ("", "")
    if tests_diff:
        try:
            _numstat(tests_diff)
        except ForkError as err:
            problems.append(f"{path.name}: its sections under {UPSTREAM_TESTS} (updates of upstream's tests) are not a "
                            f"valid diff: {err}")
    return problems


def kind_order_problems(kinds: Sequence[Optional[str]]) -> List[str]:
    """The series holds the compat patches that port upstream first, then the fixes, then the compat patches that
    must follow them (they port lines the fixes add, e.g. to today's torch_xla API), then the features.

    The fixes stay one contiguous run, so that they apply to upstream on their own (``make pr-series``).
    """
    shape = "".join({"compat": "c", "fix": "x", "feature": "f"}[k] for k in kinds if k in KINDS)
    if re.fullmatch(r"c*x*c*f*", shape):
        return []
    return ["the series must hold the compat patches first, then the fix patches, then the compat patches that port"
            " the fixes' own lines, then the feature patches"]


def check(lock_file: Optional[Path] = None, patch_dir: Path = PATCH_DIR, cache_dir: Path = CACHE_DIR) -> int:
    """Every patch has its header, the kinds are in order (compat, fix, feature), and the whole series applies cleanly."""
    lock = read_lock(lock_file)
    series = read_series(patch_dir / "series")
    problems = [p for name in series for p in validate_patch(patch_dir / name)]
    listed = set(series)
    for stray in sorted(patch_dir.glob("*.patch")):
        if stray.name not in listed:
            problems.append(f"{stray.name}: in patches/ but not in the series")
    kinds = [parse_patch((patch_dir / n).read_text())["trailers"].get("Kind") for n in series]
    problems += kind_order_problems(kinds)
    if patch_dir == PATCH_DIR and README.exists() and not sync_readme(check_only=True):
        problems.append(f"{README.name}: the version example is not {fork_version()}; "
                        "`python3 tools/fork.py readme` writes it")
    if problems:
        raise ForkError("series check failed:\n  " + "\n  ".join(problems))
    with tempfile.TemporaryDirectory() as tmp:
        build_tree(Path(tmp) / "root", series, lock, patch_dir, cache_dir)
    print(f"series OK: {len(series)} patches apply cleanly to pytorch-lightning {lock['pytorch-lightning']['version']}")
    return 0


# --------------------------------------------------------------------------------------------- making patches
def _copy_tree(src: Path, dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", STAMP_NAME, "*.orig", "*.rej")
    for pkg in PACKAGES:
        shutil.copytree(src / pkg, dest / "src" / pkg, ignore=ignore)


def make_patch(base_names: Sequence[str], src: Path, subject: str, body: str, trailers: Dict[str, str],
               author: str = AUTHOR, date: Optional[str] = None, tests_diff: str = "") -> str:
    """Diff ``src`` against upstream plus ``base_names`` and return it as a format-patch text.

    ``tests_diff`` holds sections that update upstream's own test files (see :func:`split_diff`); they are not in
    ``src``, so they are added to the diff as they are, and the diffstat is redrawn for the whole diff.
    """
    lock = read_lock()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "root"
        build_tree(repo, base_names, lock, PATCH_DIR)
        write_version(repo / "src", "1.8.6")
        _git(["init", "-q"], cwd=repo)
        _git(["add", "-A"], cwd=repo)
        _git(["commit", "-q", "-m", "base"], cwd=repo)
        shutil.rmtree(repo / "src")
        _copy_tree(src, repo)
        # the version files are the tool's bookkeeping, never part of a patch
        _git(["checkout", "--", *[f"src/{p}/__version__.py" for p in PACKAGES]], cwd=repo)
        _git(["add", "-A"], cwd=repo)
        if not _git(["diff", "--cached", "--name-only"], cwd=repo).stdout.strip():
            raise ForkError("src/ has no change against the base of this patch; nothing to write")
        trailer_text = "\n".join(f"{k}: {v}" for k, v in trailers.items())
        message = f"{subject}\n\n{body.strip()}\n\n{trailer_text}\n"
        env_date = date or email.utils.formatdate(localtime=False)
        name, mail = email.utils.parseaddr(author)
        _git(["-c", f"user.name={name}", "-c", f"user.email={mail}", "commit", "-q", "-F", "-",
              f"--author={name} <{mail}>", f"--date={env_date}"], cwd=repo, input=message)
        out = _git(["format-patch", "-1", "--stdout", "--no-signature", "--zero-commit", "--full-index"],
                   cwd=repo).stdout
    if tests_diff:
        out = with_diff(out, merge_diffs(str(parse_patch(out)["diff"]), tests_diff))
    return out


def _require_src_at(src: Path, names: Sequence[str]) -> None:
    stamp = read_stamp(src)
    if stamp is None:
        raise ForkError(f"{src} was not materialized by this tool; run `make fork` first")
    if stamp["patches"] != list(names):
        raise ForkError(
            f"{src} holds the series up to {stamp['upto']!r}, but this needs it up to {names[-1] if names else None!r}: "
            f"run `make fork UPTO={names[-1] if names else 'upstream'}`, redo your edit, and try again"
        )


def _restamp(src: Path, names: List[str]) -> None:
    """Record that ``src`` holds upstream plus ``names`` (after a patch was written from it), version included."""
    stamp = _stamp(list(names), read_series(), read_lock(), PATCH_DIR)
    write_version(src, stamp["version"])
    write_stamp(src, stamp)


def refresh(name: str, src: Path = ROOT / "src") -> Path:
    """Rewrite patch ``name`` from the edits in ``src``, which holds the series up to and including it.

    The patch's sections under ``tests/`` (updates to upstream's own tests) are kept unchanged."""
    series = read_series()
    upto = resolve_upto(series, name)
    name = upto[-1]
    _require_src_at(src, upto)
    info = parse_patch((PATCH_DIR / name).read_text())
    # src/ holds only the packages: the patch's updates to upstream's test files are carried over as they are
    _, tests_diff = split_diff(str(info["diff"]))
    text = make_patch(upto[:-1], src, str(info["subject"]), str(info["body"]), info["trailers"],
                      author=info["headers"].get("From", AUTHOR), date=info["headers"].get("Date"),
                      tests_diff=tests_diff)
    (PATCH_DIR / name).write_text(text)
    # src is now "series up to name" again, with the refreshed patch
    _restamp(src, upto)
    print(f"refreshed patches/{name}")
    _sync_repository_readme()
    return PATCH_DIR / name


def restat(name: str) -> Path:
    """Redraw the diffstat of patch ``name`` from its diff, after sections were added to it by hand (an update of
    upstream's test files), so that it says what the patch changes. Nothing else of the file changes."""
    path = PATCH_DIR / resolve_upto(read_series(), name)[-1]
    text = path.read_text()
    new = with_diff(text, merge_diffs(*split_diff(str(parse_patch(text)["diff"]))))
    if new != text:
        path.write_text(new)
        print(f"redrew the diffstat of patches/{path.name}")
        _sync_repository_readme()
    else:
        print(f"patches/{path.name}: the diffstat is current")
    return path


def new_patch(name: str, subject: str, body: str, kind: str, bug: str, forwarded: str, origin: str,
              src: Path = ROOT / "src") -> Path:
    """Turn the edits in ``src`` (which holds the whole series) into a new patch at the end of the series."""
    if kind not in KINDS:
        raise ForkError(f"--kind must be one of {KINDS}")
    if forwarded.split()[0] not in FORWARDED:
        raise ForkError(f"--forwarded must start with one of {FORWARDED}")
    series = read_series()
    if not re.fullmatch(r"\d{4}-[a-z0-9-]+\.patch", name):
        raise ForkError("patch names look like 0007-short-description.patch")
    if name in series or (PATCH_DIR / name).exists():
        raise ForkError(f"{name} exists already; use refresh")
    _require_src_at(src, series)
    text = make_patch(series, src, subject, body,
                      {"Bug": bug, "Forwarded": forwarded, "Origin": origin, "Kind": kind})
    (PATCH_DIR / name).write_text(text)
    with open(SERIES_FILE, "a") as f:
        f.write(name + "\n")
    _restamp(src, series + [name])
    print(f"wrote patches/{name} and added it to the series")
    _sync_repository_readme()
    return PATCH_DIR / name


# --------------------------------------------------------------------------------------------- README
README_BEGIN = "<!-- version:begin"
README_END = "<!-- version:end -->"


def readme_version_block(version: str) -> str:
    """The README's example of the installed version, for ``version``."""
    return (
        "```bash\n"
        "$ pip show pytorch-lightning | head -2\n"
        "Name: pytorch-lightning\n"
        f"Version: {version}\n"
        '$ python -c "import pytorch_lightning; print(pytorch_lightning.__version__)"\n'
        f"{version}\n"
        "```\n"
    )


def readme_with_version(text: str, version: str) -> str:
    """``text`` (the README) with its version block rewritten for ``version``."""
    begin = text.find(README_BEGIN)
    end = text.find(README_END)
    if begin < 0 or end < begin:
        raise ForkError(f"the README has no version block ({README_BEGIN} ... --> then {README_END})")
    head_end = text.index("\n", begin) + 1
    return text[:head_end] + readme_version_block(version) + text[end:]


def sync_readme(readme: Path = README, version: Optional[str] = None, check_only: bool = False) -> bool:
    """Make the README's version example the fork's version (``fork.py version``). Returns True when it already
    was; with ``check_only`` nothing is written."""
    version = fork_version() if version is None else version
    text = readme.read_text()
    wanted = readme_with_version(text, version)
    if wanted == text:
        return True
    if not check_only:
        readme.write_text(wanted)
    return False


def _sync_repository_readme() -> None:
    """After a patch of this repository's series changed: its version changed, and so does the README example."""
    if PATCH_DIR.resolve() == (ROOT / "patches").resolve() and README.exists() and not sync_readme():
        print(f"updated the version example in {README.name} ({fork_version()})")


# --------------------------------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="fork.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("materialize", help="write upstream + the series (or a prefix) to src/")
    p.add_argument("--upto", default=None, help="last patch to apply (name or number); 'upstream' for none")
    p.add_argument("--dest", type=Path, default=ROOT / "src")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date, discarding local edits")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where the pinned upstream wheel is kept")
    sub.add_parser("check", help="check every header and that the whole series applies")
    p = sub.add_parser("refresh", help="rewrite a patch from the edits in src/")
    p.add_argument("name")
    p = sub.add_parser("new", help="turn the edits in src/ into a new patch at the end of the series")
    p.add_argument("name")
    p.add_argument("--subject", required=True)
    p.add_argument("--body-file", type=Path, required=True)
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--bug", required=True, help="upstream issue URL, or 'none'")
    p.add_argument("--forwarded", required=True)
    p.add_argument("--origin", default="vendor, Lightning XLA fork")
    p = sub.add_parser("restat", help="redraw a patch's diffstat after sections under tests/ were added by hand")
    p.add_argument("name")
    sub.add_parser("version", help="print the fork's version")
    p = sub.add_parser("readme", help="write the fork's version into the README's version example")
    p.add_argument("--check", action="store_true", help="only check it (exit 1 when it is stale)")
    sub.add_parser("list", help="print the series with each patch's kind and subject")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "materialize":
            materialize(args.dest, args.upto, args.force, cache_dir=args.cache_dir)
        elif args.cmd == "check":
            return check()
        elif args.cmd == "refresh":
            refresh(args.name)
        elif args.cmd == "restat":
            restat(args.name)
        elif args.cmd == "new":
            new_patch(args.name, args.subject, args.body_file.read_text(), args.kind, args.bug, args.forwarded,
                      args.origin)
        elif args.cmd == "version":
            print(fork_version())
        elif args.cmd == "readme":
            if sync_readme(check_only=args.check):
                print(f"{README.name}: the version example is {fork_version()}")
            elif args.check:
                raise ForkError(f"{README.name}'s version example is stale; `python3 tools/fork.py readme` "
                                f"writes {fork_version()}")
            else:
                print(f"{README.name}: version example updated to {fork_version()}")
        elif args.cmd == "list":
            for n in read_series():
                info = parse_patch((PATCH_DIR / n).read_text())
                print(f"{n}  [{info['trailers'].get('Kind', '?')}]  {info['subject']}")
    except ForkError as err:
        print(f"fork.py: error: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as err:
        signum = err.signum if isinstance(err, Terminated) else signal.SIGINT
        print(f"fork.py: interrupted ({signal.Signals(signum).name}); nothing half-written was left behind",
              file=sys.stderr)
        return 128 + int(signum)
    return 0


if __name__ == "__main__":
    sys.exit(main())
