"""Shared fixtures. Every pytest-xdist worker is its own process, so each gets its own XLA runtime."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # `from helpers.runif import RunIf`


@pytest.fixture
def xla_metrics():
    """Reset ``torch_xla.debug.metrics`` and return a reader of the counters that a step costs."""
    import torch_xla.debug.metrics as met

    met.clear_all()

    import torch_xla.core.xla_model as xm

    class _Counts:
        @staticmethod
        def get(name: str) -> int:
            # executions run asynchronously and are counted when they finish: wait for them, or the count lags
            xm.wait_device_ops()
            data = met.metric_data(name)
            return 0 if data is None else int(data[0])

        def compiles(self) -> int:
            return self.get("CompileTime")

        def executions(self) -> int:
            return self.get("ExecuteTime")

        def transfers(self) -> int:
            return self.get("TransferFromDeviceTime")

        @staticmethod
        def clear() -> None:
            met.clear_all()

    return _Counts()


@pytest.fixture(autouse=True)
def _restore_env():
    """A test that changes ``os.environ`` never leaks it into the next one."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)
