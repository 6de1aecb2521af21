"""Shared fixtures. Every pytest-xdist worker is its own process, so each gets its own XLA runtime."""
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # `from helpers.runif import RunIf`

# the SPMD runs, shared by the Trainer's and Lite's SPMD tests; the GCS emulator of the object-storage tests
pytest_plugins = ["helpers.xla_spmd_fixtures", "helpers.gcs_emulator"]


@pytest.fixture(scope="session", autouse=True)
def _xla_runtime_first():
    """Start the XLA runtime of this worker before any test runs a backward pass.

    PyTorch's autograd engine sizes its per-device queues the first time it runs: if a CPU-only test runs
    ``backward`` before the XLA device exists, a later backward on the XLA device fails an internal assert. Tests
    that need a process whose runtime has not started run a fresh subprocess (``helpers.xla_subprocess``).
    """
    from helpers.runif import xla_device_reason

    if xla_device_reason() is None:
        import torch_xla

        torch_xla.device()
    yield


@pytest.fixture
def xla_metrics():
    """Reset ``torch_xla.debug.metrics`` and return a reader of the counters that a step costs."""
    from helpers.xla_metrics import XLACounters

    return XLACounters.cleared()


@pytest.fixture(scope="session")
def fork_server():
    """``fork_server(env)``: the ``helpers.fork_server.ForkServer`` whose children have the environment that
    ``subprocess_env(env, tests/)`` gives now (this process's, updated with ``env``) and the current working
    directory, started when first asked for. At most ``MAX_FORK_SERVERS`` are kept (an idle one holds the memory of
    the imports): asking for another closes the one used longest ago."""
    from helpers.fork_server import ForkServer, PER_TEST_VARIABLE, TESTS_DIR
    from helpers.xla_subprocess import subprocess_env

    servers = {}

    def get(env):
        full_env = subprocess_env(env, TESTS_DIR)
        # pytest names the running test in PYTEST_CURRENT_TEST, a new value for every test: the server is the same,
        # and each child gets the value of its own test (ForkServer.run)
        key = json.dumps([{k: v for k, v in full_env.items() if k != PER_TEST_VARIABLE}, os.getcwd()], sort_keys=True)
        server = servers.pop(key, None)
        if server is None:
            while len(servers) >= MAX_FORK_SERVERS:
                servers.pop(next(iter(servers))).close()
            server = ForkServer(full_env)
        servers[key] = server  # the most recently used last
        return server

    yield get
    for server in servers.values():
        server.close()


MAX_FORK_SERVERS = 4

#: a bound on waiting for the other worker's compute in ``computed_once``; each compute has its own timeouts
COMPUTE_LOCK_TIMEOUT = 1800.0


@pytest.fixture(scope="session")
def computed_once(tmp_path_factory):
    """``computed_once(key, compute)``: the JSON-serializable result of ``compute(folder)``, computed once per pytest
    session for ``key`` (a file name) and shared by the pytest-xdist workers.

    A session-scoped fixture runs once per pytest process: with ``-n 2`` both workers would run the same expensive
    training processes (the SPMD runs, the preemption tests' uninterrupted references) whenever each gets a test that
    needs them. The first worker that asks for ``key`` runs ``compute`` under a file lock, and keeps its result and
    ``folder`` (where the runs write their checkpoints) in the session's temporary directory, which the workers
    share; a worker that asks later, or while the first computes, reads that result. Both get the result as read back
    from its JSON file, so they see the same values. A ``compute`` that fails leaves no result: the next worker that
    asks tries again, and fails the same way.
    """
    from filelock import FileLock

    base = Path(tmp_path_factory.getbasetemp())
    # with pytest-xdist each worker's base directory (`popen-gw0`, ...) is inside the session's
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "computed-once"
    root.mkdir(exist_ok=True)

    def get(key, compute):
        folder, result_file = root / key, root / f"{key}.json"
        with FileLock(str(root / f"{key}.lock"), timeout=COMPUTE_LOCK_TIMEOUT):
            if not result_file.exists():
                if folder.exists():  # what a failed attempt left
                    shutil.rmtree(folder)
                folder.mkdir()
                partial = root / f"{key}.json.partial"
                partial.write_text(json.dumps(compute(folder)))
                os.replace(partial, result_file)
            return json.loads(result_file.read_text())

    return get


@pytest.fixture(autouse=True)
def _restore_env():
    """A test that changes ``os.environ`` never leaks it into the next one."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)
