"""What every part of the fork's tools shares: the checkout's paths, the two bases, the errors, and git."""
import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
LOCK_FILE = ROOT / "upstream.lock"
#: one root for both patch queues: ``patches/<upstream version>/`` holds its ``series`` and its patches
PATCHES_ROOT = ROOT / "patches"
PATCH_DIR = PATCHES_ROOT / "1.8.6"
SERIES_FILE = PATCH_DIR / "series"
PATCH_DIR_266 = PATCHES_ROOT / "2.6.6"
#: the one download cache, for every pinned wheel (pytorch-lightning 1.8.6 and lightning 2.6.6)
CACHE_DIR = ROOT / ".cache" / "upstream"
RUNTIME_REQUIREMENTS = ROOT / "requirements" / "runtime.txt"
#: the TorchTPU stack: torch-tpu, libtpu and the torch it was tested on, plus the range of torch torch-tpu takes
TORCHTPU_REQUIREMENTS = ROOT / "requirements" / "torchtpu.txt"
README = ROOT / "README.md"
# seconds; both can be changed through the environment
LOCK_TIMEOUT_ENV, LOCK_TIMEOUT_DEFAULT = "FORK_LOCK_TIMEOUT", 600.0
DOWNLOAD_TIMEOUT_ENV, DOWNLOAD_TIMEOUT_DEFAULT = "FORK_DOWNLOAD_TIMEOUT", 600.0
PIP = [sys.executable, "-m", "pip"]
PACKAGES = ("pytorch_lightning", "lightning_lite")
# compat patches port 1.8.6 to the current stack, fix patches are the upstream fixes, feature patches add what upstream
# never had (the SPMD strategies); the series keeps them in that order
KINDS = ("compat", "fix", "feature")
AUTHOR = "Lightning XLA fork <lightning-xla-fork@users.noreply.github.com>"
# a patch's sections under this path update upstream's own tests (tag 1.8.6's ``tests/``), see patchfile.split_diff
UPSTREAM_TESTS = "tests/"


class ForkError(Exception):
    """A problem the user has to fix; printed without a traceback."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived while a tree was being built (raised so that the staging folder is removed)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def seconds_from_env(name: str, default: float) -> float:
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


def unwritable(path: Path, err: OSError) -> ForkError:
    """The error for a folder that materialize has to write to and cannot (read-only checkout, permissions)."""
    why = "it is on a read-only file system" if err.errno == errno.EROFS else (err.strerror or str(err))
    return ForkError(
        f"cannot write to {path}: {why}. `fork.py materialize` writes the generated tree next to it "
        f"(a staging folder, then the swap), a lock file, and the download cache (--cache-dir, by default "
        f".cache/upstream in the checkout). In a read-only "
        f"checkout, write the tree elsewhere: `python3 tools/fork.py materialize --dest /some/writable/src "
        f"--cache-dir /some/writable/cache`, or make the checkout writable."
    )


def git(args: Sequence[str], cwd: Path, check: bool = True, **kw) -> subprocess.CompletedProcess:
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


def commit(repo: Path, message: str, author: str, date: str, allow_empty: bool = True) -> None:
    """Commit the index of ``repo`` as ``author`` (``Name <mail>``) at ``date``, with ``message`` from stdin."""
    import email.utils

    name, mail = email.utils.parseaddr(author)
    git(["-c", f"user.name={name}", "-c", f"user.email={mail}", "commit", "-q",
         *(["--allow-empty"] if allow_empty else []), "-F", "-", f"--author={name} <{mail}>", f"--date={date}"],
        cwd=repo, input=message)


def match_patch(names: Sequence[str], wanted: Optional[str]) -> Optional[str]:
    """The one name of ``names`` that is ``wanted`` or starts with its number (``0003``); None when none or many."""
    matches = [n for n in names if n == wanted or n.split("-", 1)[0] == wanted]
    return matches[0] if len(matches) == 1 else None
