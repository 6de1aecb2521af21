"""Run a script on TorchTPU's ``"tpu"`` device in a fresh interpreter: on the stand-in (``helpers.tpu_standin``) here,
on the real ``torch-tpu`` on a TPU VM (``PL_TORCH_TPU_REAL=1``, which the Cloud TPU VM workflow sets).

A fresh interpreter, because the stand-in must be registered before anything imports ``torch`` with ``torch-tpu``'s
own loader turned off (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); a file rather than ``python -c``, because the processes
that ``ddp_spawn`` starts import the script again (``spawn``), and must register the device too. The script's work is
the body of ``main()``; ``emit(value)`` hands a JSON value back.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Optional

from helpers.xla_subprocess import last_emitted, RESULT_MARKER, subprocess_env

TESTS_DIR = str(Path(__file__).resolve().parent.parent)
#: set on a TPU VM with torch-tpu and chips: the scripts run on the real device, without the stand-in
REAL_VARIABLE = "PL_TORCH_TPU_REAL"

_PRELUDE = f"""\
import json as _json
import os as _os
import sys as _sys

_sys.path.insert(0, {TESTS_DIR!r})
if _os.environ.get({REAL_VARIABLE!r}) != "1":
    from helpers.tpu_standin import install as _install

    _install()


def emit(value):
    print({RESULT_MARKER!r} + _json.dumps(value), flush=True)


"""


def on_real_tpu() -> bool:
    return os.environ.get(REAL_VARIABLE) == "1"


def run_script(folder: Path, body: str, devices: int = 1, timeout: float = 600,
               env: Optional[Dict[str, Optional[str]]] = None) -> "subprocess.CompletedProcess[str]":
    """Write ``body`` (the statements of ``main()``, after any imports and definitions it needs at the top level
    marked by a line ``# main``) to ``folder/run.py`` and run it; return the finished process, whatever its status."""
    head, _, main = textwrap.dedent(body).partition("# main\n")
    script = folder / "run.py"
    script.write_text(
        _PRELUDE + head + "\n\ndef main():\n" + textwrap.indent(main or "pass\n", "    ")
        + '\n\nif __name__ == "__main__":\n    main()\n'
    )
    variables: Dict[str, Optional[str]] = {"PYTHONWARNINGS": "ignore:<TorchTpu/Performance/TcMalloc/"}
    if not on_real_tpu():
        variables.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", TPU_STANDIN_DEVICES=str(devices))
    variables.update(env or {})
    return subprocess.run([sys.executable, str(script)], env=subprocess_env(variables, TESTS_DIR), cwd=str(folder),
                          capture_output=True, text=True, timeout=timeout)


def run(folder: Path, body: str, devices: int = 1, timeout: float = 600,
        env: Optional[Dict[str, Optional[str]]] = None) -> Any:
    """:func:`run_script` for a script that must succeed: the JSON value it emitted last."""
    return last_emitted(run_script(folder, body, devices=devices, timeout=timeout, env=env))
