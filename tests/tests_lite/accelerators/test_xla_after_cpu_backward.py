"""``LightningLite(accelerator="tpu")`` in a process whose first backward pass ran before the XLA runtime started,
and the check that finds such a process (``_autograd_has_no_thread_for``).

PyTorch's autograd engine creates its device threads once per process, at the first backward pass; torch_xla reports
no XLA device to it until its runtime has started (pytorch/xla#4174). A CPU Lite run and then a TPU Lite run in the
same process crashed at the TPU run's first backward with ``INTERNAL ASSERT FAILED at .../autograd/engine.cpp``. The
TPU accelerator now detects this when the strategy sets up its device and runs the backward passes on the calling
thread: the run reaches the weights of a fresh process. Each history runs in a fresh process.
"""
import os

import pytest

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

# compat patch `compat-xla-backward-after-a-cpu-backward` (the fork's CPU Trainer never starts the XLA runtime);
# tests of compat patches name no FIXED_BY

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTICE = "autograd has no worker thread for XLA devices"
SPMD_TOLERANCE = 1e-5  # float32, as in test_xla_spmd.py

_RUN = """
import sys
sys.path.insert(0, {tests!r})
from helpers.xla_process_history import lite_run, make_history
make_history({history!r}, {tmp!r})
emit(lite_run({strategy!r}))
"""


def _run(history: str, strategy, tmp_path, devices: int = 1) -> dict:
    code = _RUN.format(tests=TESTS_DIR, history=history, strategy=strategy, tmp=str(tmp_path))
    return run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices)}, timeout=240)


def _noticed(run: dict) -> bool:
    return any(NOTICE in message for message in run["messages"])


@pytest.fixture(scope="module")
def fresh(computed_once):
    """The same Lite run on one XLA device, in a fresh process; made once per session (shared by the pytest-xdist
    workers)."""
    return computed_once("after-cpu-backward-lite-fresh", lambda folder: _run("fresh", None, folder))


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "devices"),
    [
        (None, 1),
        # `xmp.spawn` forks the process that trains; the check runs there, not in the main process
        ("xla", 1),
        ("xla_spmd", 4),
    ],
)
def test_tpu_run_after_a_cpu_run_trains_as_in_a_fresh_process(fresh, strategy, devices, tmp_path):
    import torch

    run = _run("cpu_lite", strategy, tmp_path, devices=devices)
    difference = max((torch.tensor(run["weights"][k]) - torch.tensor(v)).abs().max().item()
                     for k, v in fresh["weights"].items())
    assert difference <= (SPMD_TOLERANCE if strategy == "xla_spmd" else 0.0)
    assert run["multithreading"] is False and _noticed(run)
    assert fresh["multithreading"] is True and not _noticed(fresh)
    if strategy == "xla":
        # the main process was left alone
        assert run["multithreading_after"] is True


_PROBE = """
import sys
sys.path.insert(0, {tests!r})
import torch
import torch_xla
from helpers.xla_metrics import XLACounters
from lightning_lite.accelerators.tpu import _autograd_has_no_thread_for

def cpu_backward():
    x = torch.randn(3, requires_grad=True)
    (x * 2).sum().backward()

if {cpu_backward_first!r}:
    cpu_backward()
XLACounters.clear()
found = _autograd_has_no_thread_for(torch.device("xla", 0))
# the counts as they stand, without waiting for the device
costs = [XLACounters.value(n)
         for n in ("CompileTime", "ExecuteTime", "TransferToDeviceTime", "TransferFromDeviceTime")]
# a CPU backward after the check, then one on XLA: the check did not leave the engine without its XLA thread
cpu_backward()
try:
    y = torch.ones(3, device=torch_xla.device(), requires_grad=True)
    (y * 2).sum().backward()
    torch_xla.sync()
    grad = y.grad.cpu().tolist()
except RuntimeError as err:
    grad = str(err)[:200]
emit({{"found": found, "costs": costs, "grad": grad}})
"""


@RunIf(xla=True)
@pytest.mark.parametrize("cpu_backward_first", [False, True])
def test_the_check_finds_the_missing_thread_and_costs_nothing(cpu_backward_first):
    """The check is a backward pass on XLA: it compiles, executes and transfers nothing. Run as the first backward
    pass of a process (torch_xla imported, its runtime not started yet), it starts the runtime before its backward,
    so that it never is the backward that leaves autograd without its XLA thread."""
    code = _PROBE.format(tests=TESTS_DIR, cpu_backward_first=cpu_backward_first)
    result = run_python(code, env={"PJRT_DEVICE": "CPU"}, timeout=120)
    assert result["found"] is cpu_backward_first
    assert result["costs"] == [0, 0, 0, 0]
    if cpu_backward_first:
        # the state the check reports: a plain backward on XLA fails in this process
        assert "device_ready_queues_" in result["grad"]
    else:
        assert result["grad"] == [2.0, 2.0, 2.0]
