"""Which Lightning each row of a benchmark runs, and the environment of the row's process.

A row imports one Lightning and nothing else of it: a tree of the fork (``src/`` of this checkout, or a prefix of the
series materialized under ``build/bench/trees/``), the fork installed in the venv, Lightning 2.6.6 installed apart in
``build/bench/pl266``, or none (the hand-written loops). The row's process gets that tree, and only it, on
``PYTHONPATH`` (:func:`row_env`); the drivers start it as ``python -m bench.<module>`` from the checkout's root
(:func:`module_command`), so it imports the benchmark's own modules as the package they are.

This module imports neither torch nor Lightning: the drivers call it before anything is measured.
"""
import json
import os
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "bench"
PL266_VERSION = "2.6.6"


class BenchError(Exception):
    pass


def default_pjrt_device() -> str:
    """``PJRT_DEVICE`` for every row, unless it is set: TPU where this host has TPU chips (``/dev/accel*`` or
    ``/dev/vfio/*``), else XLA on the CPU. The rows inherit it from the driver's environment."""
    return os.environ.setdefault(
        "PJRT_DEVICE", "TPU" if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") else "CPU")


def fork_src() -> Optional[Path]:
    """``src/`` of this checkout when it holds the fork, else None (the rows import the fork installed in the
    venv)."""
    return ROOT / "src" if (ROOT / "src" / "pytorch_lightning").is_dir() else None


def row_env(pythonpath: Optional[Path], base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of a row's process: the driver's (or ``base``), with ``pythonpath`` (the row's Lightning) as
    its only ``PYTHONPATH``, or none (the venv's own packages, or no Lightning at all)."""
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    return env


def module_command(python: str, module: str, *args: str) -> List[str]:
    """``python -m bench.<module> args``: run it with ``cwd=ROOT`` (:data:`ROOT`), where ``bench`` is importable."""
    return [python, "-m", f"bench.{module}", *args]


def stem(name: str) -> str:
    return name[:-len(".patch")] if name.endswith(".patch") else name


# --------------------------------------------------------------------------------------------- the fork's trees
def materialize(upto: str, python: str) -> Path:
    """The series up to and including ``upto`` (``upstream``: none of it) in ``build/bench/trees/<upto>/src``."""
    dest = BUILD / "trees" / stem(upto) / "src"
    cmd = [python, str(ROOT / "tools" / "fork.py"), "materialize", "--upto", upto, "--dest", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"materializing the series up to {upto} failed:\n{proc.stdout}{proc.stderr}")
    return dest


# --------------------------------------------------------------------------------------------- Lightning 2.6.6
def _requirements_of(dist_info: Path) -> List[str]:
    reqs = []
    for line in (dist_info / "METADATA").read_text().splitlines():
        if line.startswith("Requires-Dist:"):
            reqs.append(line.split(":", 1)[1].strip())
    return reqs


def missing_requirements(reqs: List[str], python: str) -> List[str]:
    """The requirements (extras excluded) that the row interpreter's environment does not satisfy."""
    probe = (
        "import json, sys, importlib.metadata as md\n"
        "from packaging.requirements import Requirement\n"
        "out = []\n"
        "for r in json.loads(sys.argv[1]):\n"
        "    req = Requirement(r)\n"
        "    if req.marker is not None and not req.marker.evaluate({'extra': ''}):\n"
        "        continue\n"
        "    try:\n"
        "        ok = req.specifier.contains(md.version(req.name), prereleases=True)\n"
        "    except md.PackageNotFoundError:\n"
        "        ok = False\n"
        "    if not ok:\n"
        "        out.append(str(req))\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([python, "-c", probe, json.dumps(reqs)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"could not check the requirements of Lightning {PL266_VERSION}:\n{proc.stderr}")
    return json.loads(proc.stdout)


def install_pl266(python: str) -> Tuple[Path, List[str]]:
    """``pip install --target build/bench/pl266 --no-deps pytorch-lightning==2.6.6``, plus any missing dependency
    (also into the target, never into the venv), so 2.6.6 never mixes with the fork."""
    target = BUILD / "pl266"
    dist_info = target / f"pytorch_lightning-{PL266_VERSION}.dist-info"
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--target", str(target), "--no-deps"]
    if not dist_info.exists():
        proc = subprocess.run(pip + [f"pytorch-lightning=={PL266_VERSION}"], capture_output=True, text=True)
        if proc.returncode != 0 or not dist_info.exists():
            raise BenchError(f"pip could not install pytorch-lightning=={PL266_VERSION} into {target}:\n"
                             f"{proc.stdout}{proc.stderr}")
    missing = missing_requirements(_requirements_of(dist_info), python)
    if missing:
        print(f"[bench] installing the dependencies of Lightning {PL266_VERSION} missing from the venv into "
              f"{target}: {', '.join(missing)}", flush=True)
        proc = subprocess.run(pip + missing, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BenchError(f"pip could not install {missing} into {target}:\n{proc.stdout}{proc.stderr}")
    return target, missing
