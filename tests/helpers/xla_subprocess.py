"""Run a Python snippet in a fresh interpreter that imports the same fork tree as the tests.

Tests that need a process whose XLA runtime has not started yet (``xmp.spawn`` refuses to start otherwise, and other
tests of the same pytest worker may have started it) run their code this way, always with a timeout so that a hang
fails the test instead of blocking the suite.
"""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Optional

import lightning_lite
import pytorch_lightning

_SRC_ROOTS = {str(Path(m.__file__).resolve().parent.parent) for m in (lightning_lite, pytorch_lightning)}
RESULT_MARKER = "@@RESULT@@"


def subprocess_env(env: Optional[Dict[str, Optional[str]]] = None, *paths: str) -> Dict[str, str]:
    """The environment of a fresh interpreter that imports the same fork tree as this one (and ``paths`` too): this
    process's, updated with ``env``, where ``None`` removes a variable."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([*sorted(_SRC_ROOTS), *paths, full_env.get("PYTHONPATH", "")])
    full_env.update(env or {})
    return {key: value for key, value in full_env.items() if value is not None}


def run_python(code: str, env: Optional[Dict[str, str]] = None, timeout: float = 120, cwd: Optional[str] = None) -> Any:
    """Run ``code`` and return the JSON value it printed with ``emit(value)``; fail with its output otherwise."""
    prelude = (
        "import json as _json\n"
        f"def emit(value):\n    print({RESULT_MARKER!r} + _json.dumps(value), flush=True)\n"
    )
    full_env = subprocess_env(env)
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = [line[len(RESULT_MARKER):] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not results:
        raise AssertionError(
            f"subprocess failed (exit {proc.returncode}):\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
            f"{proc.stderr[-6000:]}"
        )
    return json.loads(results[-1])
