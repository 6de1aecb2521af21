"""What a result under ``results/`` measured: the fork's version with the digest of its series, the date and the
machine (the ``stamp`` of a JSON result, and the line under the title of a Markdown one).

A stamp is made when a result is written (``bench/report.py`` for the benchmarks, which calls :func:`make`) and
read by the checks of the pages that quote results (``forkq.bench_readme``): a figure is current only when its
result's ``digest`` is the digest of the series now in ``patches/1.8.6`` (:func:`current_digest`). Standard library
only."""
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, Optional

from . import common
from .seriesfile import read_series
from .tree import fork_version, series_digest
from .upstream import read_lock

#: the line of a Markdown result that carries its stamp starts with this
LINE_PREFIX = "Measured on the fork "
UNKNOWN = "unknown"


def current_digest(patch_dir: Optional[Path] = None) -> str:
    """The digest of the series now in ``patch_dir`` (``patches/1.8.6``), as in :func:`forkq.tree.fork_version`."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    return series_digest(read_series(patch_dir / "series"), read_lock(), patch_dir)


def machine() -> Dict[str, Any]:
    """The machine a result was measured on: architecture, CPU model and count, system, XLA device kind."""
    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"arch": platform.machine(), "cpu": cpu, "cpus": os.cpu_count(),
            "system": f"{platform.system()} {platform.release()}", "pjrt_device": os.environ.get("PJRT_DEVICE")}


def make(patch_dir: Optional[Path] = None, **extra: Any) -> Dict[str, Any]:
    """The stamp of a result measured now, on the series now in ``patch_dir``; ``extra`` adds fields (what tree
    the rows imported, for example)."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    lock = read_lock()
    series = read_series(patch_dir / "series")
    return {"fork": fork_version(lock, series, patch_dir), "digest": series_digest(series, lock, patch_dir),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(), **extra}


def _machine_text(m: Any) -> str:
    if not isinstance(m, dict):
        return str(m or UNKNOWN)
    parts = [f"{m['cpus']} CPUs" if m.get("cpus") else None, m.get("cpu"), m.get("arch"), m.get("system"),
             f"PJRT_DEVICE={m['pjrt_device']}" if m.get("pjrt_device") else None]
    return ", ".join(p for p in parts if p) or UNKNOWN


def line(stamp: Dict[str, Any]) -> str:
    """The Markdown line of ``stamp``: fork version, digest, date, machine (and how it was stamped, when not at the
    run)."""
    digest = stamp.get("digest") or UNKNOWN
    text = (f"{LINE_PREFIX}{stamp.get('fork') or UNKNOWN} (series digest {digest[:12]}), {stamp.get('date') or UNKNOWN}"
            f"; machine: {_machine_text(stamp.get('machine'))}.")
    if stamp.get("note"):
        text += f" {stamp['note']}"
    return f"_{text}_"


def is_current(stamp: Optional[Dict[str, Any]], digest: str) -> bool:
    """Whether a result with ``stamp`` measured the series whose digest is ``digest``."""
    return bool(stamp) and stamp.get("digest") == digest
