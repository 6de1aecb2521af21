"""Results that one pytest session computes once, shared by its pytest-xdist workers.

A session-scoped fixture runs once per pytest process: with ``-n 2`` both workers would run the same expensive
training processes (the SPMD runs, the uninterrupted reference runs of the preemption tests) whenever each of them
gets a test that needs them. ``computed_once(tmp_path_factory, key, compute)`` runs ``compute(folder)`` in the first
worker that asks for ``key``, under a file lock, and keeps its JSON result and ``folder`` (where the runs write their
checkpoints) in the session's temporary directory, which the workers share; a worker that asks later, or while the
first one computes, reads that result. Both get the result as read back from its JSON file, so they see the same
values. A ``compute`` that fails leaves no result: the next worker that asks tries again, and fails the same way.
"""
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from filelock import FileLock

LOCK_TIMEOUT = 1800.0  # a bound on waiting for the other worker's compute; each compute has its own timeouts


def session_dir(tmp_path_factory: Any) -> Path:
    """The temporary directory of the whole session: with pytest-xdist each worker's base directory (``popen-gw0``,
    ...) is inside it; without, it is the base directory itself."""
    base = Path(tmp_path_factory.getbasetemp())
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def computed_once(tmp_path_factory: Any, key: str, compute: Callable[[Path], Any]) -> Any:
    """``compute(folder)``'s JSON-serializable result, computed once per session for ``key`` (a file name)."""
    root = session_dir(tmp_path_factory) / "computed-once"
    root.mkdir(exist_ok=True)
    folder, result_file = root / key, root / f"{key}.json"
    with FileLock(str(root / f"{key}.lock"), timeout=LOCK_TIMEOUT):
        if not result_file.exists():
            if folder.exists():  # what a failed attempt left
                shutil.rmtree(folder)
            folder.mkdir()
            text = json.dumps(compute(folder))
            partial = root / f"{key}.json.partial"
            partial.write_text(text)
            os.replace(partial, result_file)
        return json.loads(result_file.read_text())
