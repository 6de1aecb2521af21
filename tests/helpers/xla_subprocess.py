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
from typing import Any, Callable, Dict, List, Optional

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


def run_code(code: str, env: Optional[Dict[str, Optional[str]]] = None, timeout: float = 120,
             cwd: Optional[str] = None, fork_server: Optional[Callable[..., Any]] = None,
             set_env: Optional[Dict[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    """Run ``code`` as ``python -c code`` runs it, with ``emit(value)`` defined (a line of JSON after
    ``RESULT_MARKER``), and return the finished process, whatever its exit status.

    ``env``: this process's environment updated with it (``subprocess_env``), ``None`` removing a variable.
    ``fork_server``: the fixture of that name; the process is then forked from an interpreter that imported torch,
    torch_xla and Lightning already (``helpers.fork_server``), which saves the imports' several seconds of CPU. Pass it
    wherever the claim is not about what a fresh interpreter imports or starts. Each ``env`` has a server of its own:
    variables that are read only when used (a bucket's endpoint, Lightning's ``PL_*``, the device count, read when the
    runtime starts) go in ``set_env``, which the process sets in ``os.environ`` before ``code`` runs, so that such runs
    share the server of their ``env``."""
    prelude = (
        "import json as _json\n"
        f"def emit(value):\n    print({RESULT_MARKER!r} + _json.dumps(value), flush=True)\n"
    )
    if set_env:
        prelude = f"import os as _os\n_os.environ.update({dict(set_env)!r})\n" + prelude
    if fork_server is not None:
        chdir = f"import os as _os\n_os.chdir({cwd!r})\n" if cwd is not None else ""
        return fork_server(env).run(chdir + prelude + textwrap.dedent(code), timeout=timeout)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=subprocess_env(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def emitted(proc: "subprocess.CompletedProcess[str]") -> List[Any]:
    """The values a ``run_code`` process emitted, in order."""
    return [json.loads(line[len(RESULT_MARKER):]) for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]


def run_python(code: str, env: Optional[Dict[str, Optional[str]]] = None, timeout: float = 120,
               cwd: Optional[str] = None, fork_server: Optional[Callable[..., Any]] = None,
               set_env: Optional[Dict[str, str]] = None) -> Any:
    """``run_code``, for a process that must succeed: the JSON value it emitted last; fail with its output
    otherwise."""
    return last_emitted(run_code(code, env=env, timeout=timeout, cwd=cwd, fork_server=fork_server, set_env=set_env))


def last_emitted(proc: "subprocess.CompletedProcess[str]") -> Any:
    """The JSON value a process that must succeed emitted last; fail with its output otherwise."""
    results = emitted(proc)
    if proc.returncode != 0 or not results:
        raise AssertionError(
            f"subprocess failed (exit {proc.returncode}):\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n"
            f"{proc.stderr[-6000:]}"
        )
    return results[-1]
