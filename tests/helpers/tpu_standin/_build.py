"""Build the stand-in's C++ extension once per source and torch version, and load it.

The build goes to ``<repository>/.cache/tpu_standin/<key>``, where the key hashes the sources, the compiler flags,
torch's version and the Python ABI: every later process (a pytest-xdist worker, a spawned DDP rank) imports the
built library without compiling. A file lock in that directory makes one process build while the others wait.
"""
import functools
import hashlib
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

_HERE = Path(__file__).resolve().parent
SOURCES = (_HERE / "standin.cpp",)
CACHE_ROOT = _HERE.parents[2] / ".cache" / "tpu_standin"
EXTENSION_NAME = "tpu_standin_ext"
CFLAGS = ("-O1",)
#: a bound on waiting for another process's build (a cold build takes a few minutes on 2 cores)
BUILD_LOCK_TIMEOUT = 1200.0
# the marker of a finished build: the library exists before the build has finished writing it
_DONE = "built"


def build_key() -> str:
    """What the built library depends on: the sources, the flags, torch's version and the Python ABI."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    digest.update(" ".join(CFLAGS).encode())
    digest.update(torch.__version__.encode())
    digest.update(sys.implementation.cache_tag.encode())
    return digest.hexdigest()[:16]


def build_directory() -> Path:
    return CACHE_ROOT / build_key()


@functools.lru_cache(maxsize=1)
def extension() -> ModuleType:
    """The loaded extension: imported from the cache, built into it first when missing.

    Loading registers the device's kernels, guard, allocator, generators and hooks with PyTorch (static
    registrations of the library): call it from ``install()`` only.
    """
    from filelock import FileLock

    directory = build_directory()
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / _DONE).exists():
        with FileLock(str(directory / "build.lock"), timeout=BUILD_LOCK_TIMEOUT):
            if not (directory / _DONE).exists():
                return _build(directory)
    return _import(directory)


def _build(directory: Path) -> ModuleType:
    """Compile and load the extension (``torch.utils.cpp_extension.load``, which needs ``ninja`` on the PATH)."""
    from torch.utils.cpp_extension import load

    start = time.monotonic()
    module = load(
        name=EXTENSION_NAME,
        sources=[str(source) for source in SOURCES],
        extra_cflags=list(CFLAGS),
        build_directory=str(directory),
        is_python_module=True,
        verbose=False,
    )
    (directory / _DONE).write_text(f"{time.monotonic() - start:.1f} s\n")
    return module


def _import(directory: Path) -> ModuleType:
    path = directory / f"{EXTENSION_NAME}.so"
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"tpu stand-in: cannot import the built extension {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[EXTENSION_NAME] = module
    return module
