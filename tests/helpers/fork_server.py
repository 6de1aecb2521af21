"""Fresh training processes without paying for the imports each time: an interpreter that imported torch, torch_xla
and Lightning once forks a new process for every run.

A test that starts many short training processes (the preemption tests start about 40) spends most of each one's
time importing torch and torch_xla (several seconds; the training itself takes two or three). ``ForkServer(env)``
starts one interpreter with the whole environment ``env`` that a fresh process would get (``subprocess_env(...,
tests/)``, so that ``helpers`` imports), which imports ``PRELOAD`` and nothing else: no XLA runtime starts, no tensor
is made, no thread of its own is started (torch starts one at import, as in every process; ``tpu_spawn``'s launcher
forks its replicas in the same state), and the imported objects are frozen for the garbage collector
(``gc.freeze``), so that a child's collections do not copy the server's memory page by page.

``run(code, args)`` then forks it: the child is a session of its own (``os.setsid``, as ``start_new_session=True``
does), has ``SIGTERM`` at its default action, stdin from ``/dev/null`` and its stdout and stderr captured, and runs
``code`` as ``python -c code *args`` runs it, in the ``__main__`` module: an uncaught exception prints its traceback
and exits with status 1, ``SystemExit`` gives its code, and the interpreter's usual shutdown follows (``atexit``
handlers included). ``run`` returns a ``subprocess.CompletedProcess`` as ``subprocess.run(..., capture_output=True,
text=True)`` does.

The only difference from a fresh process is that the preloaded modules were imported before the fork, in a process
with the same environment, command-line flags and working directory. The XLA runtime, autograd's device threads and
everything a run sets up start in the child. Use ``helpers.xla_subprocess`` instead where the claim is about the
imports themselves (which module imports torch_xla, what happens before the runtime starts or the first backward).

One server per environment and pytest process (the ``fork_server`` fixture of ``tests/conftest.py`` keeps them: the
environment is compared whole, so a variable that a test set in ``os.environ`` gets a server of its own), except for
``PYTEST_CURRENT_TEST``, which pytest sets to the name of the running test: a child gets the value its client has at
the time of the run. A server serves one run at a time and exits when its client kills it or the pytest process that
started it is gone.
"""
import gc
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

TESTS_DIR = str(Path(__file__).resolve().parent.parent)
PRELOAD = (
    "torch", "torch_xla", "torch_xla.core.xla_model", "torchmetrics", "pytorch_lightning", "lightning_lite",
    "pytorch_lightning.callbacks", "pytorch_lightning.loggers", "helpers.preemption_runs",
    "helpers.gloo_xla_collectives", "helpers.xla_metrics",
)
START_TIMEOUT = 180.0
#: the one variable of the environment that a child takes from its client at the time of the run, not from the
#: server: pytest sets it to the name of the running test, a new value for every test
PER_TEST_VARIABLE = "PYTEST_CURRENT_TEST"


def _read_line(conn: socket.socket) -> Any:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError(f"the fork server closed the connection ({data!r})")
        data += chunk
    return json.loads(data)


def _serve(path: str, preload: Sequence[str]) -> Optional[Dict[str, Any]]:
    """Import ``preload``, then fork a child for every request on the socket ``path``. Returns the request in the
    child; returns ``None`` in the server when it stops."""
    import importlib

    for name in preload:
        importlib.import_module(name)
    import torch_xla

    if torch_xla._XLAC._xla_runtime_is_initialized():
        raise RuntimeError(f"importing {preload} started the XLA runtime: a forked child could not use it")
    # the imported objects are never garbage: keep the collector of every child from walking them (which would
    # copy each page of the server's memory into the child, seconds for every run)
    gc.freeze()
    client = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".partial")
    listener.listen(1)
    os.rename(path + ".partial", path)  # the client connects once the socket is there
    listener.settimeout(2.0)
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if os.getppid() != client:  # the pytest process is gone
                return None
            continue
        conn.settimeout(None)
        try:
            request = _read_line(conn)
        except ConnectionError:
            conn.close()
            return None  # the client closed the server
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            return request
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the client is gone (interrupted): the run still ends before the next one starts
            pass
        _, status = os.waitpid(pid, 0)
        try:
            conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        except OSError:
            pass
        conn.close()


def _become_the_run(request: Dict[str, Any]) -> None:
    """In the forked child: the process state that ``subprocess.run([python, "-c", code, *args],
    start_new_session=True, capture_output=True)`` gives, with ``SIGTERM`` at its default action."""
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        out = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.argv = ["-c", *request["args"]]
    sys.path[0] = ""  # as for `python -c`
    if request["per_test"] is None:
        os.environ.pop(PER_TEST_VARIABLE, None)
    else:
        os.environ[PER_TEST_VARIABLE] = request["per_test"]


class ForkServer:
    """A preloaded interpreter with the environment ``env``, whole (``helpers.xla_subprocess.subprocess_env`` makes
    it; see the module's docstring)."""

    def __init__(self, env: Dict[str, str]) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="fork-server-"))
        self._socket = str(self._dir / "socket")
        self._log = open(self._dir / "server.log", "w+")
        self._runs = 0
        self._proc = subprocess.Popen(
            [sys.executable, "-c", f"from helpers.fork_server import main; main({self._socket!r})"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _connect(self) -> socket.socket:
        end = time.monotonic() + START_TIMEOUT
        while not os.path.exists(self._socket):
            if self._proc.poll() is not None or time.monotonic() > end:
                self._log.seek(0)
                raise RuntimeError(
                    f"the fork server did not start (exit {self._proc.poll()}):\n{self._log.read()[-6000:]}")
            time.sleep(0.05)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self._socket)
        return conn

    def run(self, code: str, args: List[str] = (), timeout: float = 420) -> subprocess.CompletedProcess:
        """``code`` in a new process forked from the server, as ``python -c code *args`` (see the module's
        docstring); ``subprocess.TimeoutExpired`` after ``timeout`` seconds, the process killed."""
        self._runs += 1
        out = {name: str(self._dir / f"run{self._runs}.{name}") for name in ("stdout", "stderr")}
        conn = self._connect()
        try:
            request = {"code": code, "args": list(args), "per_test": os.environ.get(PER_TEST_VARIABLE), **out}
            conn.sendall(json.dumps(request).encode() + b"\n")
            conn.settimeout(timeout)
            pid = _read_line(conn)["pid"]
            try:
                returncode = _read_line(conn)["returncode"]
            except socket.timeout:
                try:
                    os.killpg(pid, signal.SIGKILL)  # the run and every process it started
                except ProcessLookupError:  # it ended just now
                    pass
                conn.settimeout(60)
                _read_line(conn)
                raise subprocess.TimeoutExpired(["fork-server", code, *args], timeout,
                                                *(Path(out[n]).read_text() for n in ("stdout", "stderr")))
        finally:
            conn.close()
        stdout, stderr = (Path(out[n]).read_text() for n in ("stdout", "stderr"))
        for path in out.values():
            os.unlink(path)
        return subprocess.CompletedProcess(["fork-server", code, *args], returncode, stdout, stderr)

    def close(self) -> None:
        # the server holds nothing but its imports and serves no run now: no need for an orderly exit
        self._proc.kill()
        self._proc.wait()
        self._log.close()
        for path in self._dir.iterdir():
            path.unlink()
        self._dir.rmdir()


def main(path: str) -> None:
    request = _serve(path, PRELOAD)
    if request is None:
        return
    _become_the_run(request)
    # the child: `code` runs in the `__main__` module, as `python -c code` runs it (the server's own `-c` code left
    # only the name of this function there)
    namespace = sys.modules["__main__"].__dict__
    for name in [n for n in namespace if not (n.startswith("__") and n.endswith("__"))]:
        del namespace[name]
    exec(compile(request["code"], "<string>", "exec"), namespace)
