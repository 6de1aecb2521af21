"""A TPU Trainer in a process whose first backward pass ran before the XLA runtime started.

PyTorch's autograd engine creates its device threads once per process, at the first backward pass, for the devices
that the device types report at that moment; torch_xla reports no XLA device until its runtime has started
(pytorch/xla#4174). So a CPU fit (or any backward pass on the CPU, whether torch_xla was imported or not) and then a
TPU fit in the same process crashed at the TPU fit's first backward with ``INTERNAL ASSERT FAILED at
.../autograd/engine.cpp`` about ``device_ready_queues_``; so did the process that ``xmp.spawn`` forks from such a
process, and the SPMD strategies. The TPU accelerator now detects this when the run sets up its device and runs the
backward passes on the thread that trains. That trains exactly as a fresh process does (same weights, same
compilations, graphs and transfers per step), and nothing changes in a process whose XLA runtime started before its
first backward pass.

Each history runs in a fresh process (``helpers.xla_process_history``).
"""
import os

import pytest

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

# compat patch `compat-xla-backward-after-a-cpu-backward` (the fork's CPU Trainer never starts the XLA runtime);
# tests of compat patches name no FIXED_BY

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOTICE = "autograd has no worker thread for XLA devices"
STEADY = {"compiles": 0, "executions": 1, "transfers": 1}
SPMD_TOLERANCE = 1e-5  # float32, as in test_xla_spmd.py

_RUN = """
import sys
sys.path.insert(0, {tests!r})
from helpers.xla_process_history import make_history, trainer_fit
first = make_history({history!r}, {tmp!r})
emit({{"first": first, "run": trainer_fit({strategy!r}, {tmp!r} + "/run")}})
"""


def _run(history: str, strategy: str, tmp_path, devices: int = 1) -> dict:
    code = _RUN.format(tests=TESTS_DIR, history=history, strategy=strategy, tmp=str(tmp_path))
    return run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices)}, timeout=240)


def _noticed(run: dict) -> bool:
    return any(NOTICE in message for message in run["messages"])


def _max_difference(a: dict, b: dict) -> float:
    import torch

    assert a.keys() == b.keys()
    return max((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def healthy(computed_once):
    """A TPU fit in a fresh process (``first``), then a CPU fit, then a TPU fit again (``run``): the order that
    always worked, since the first backward pass of the process ran on XLA. Made once per session (shared by the
    pytest-xdist workers)."""
    return computed_once("after-cpu-backward-healthy",
                         lambda folder: _run("tpu_fit_then_cpu_fit", "single", folder))


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("history", "strategy"),
    [
        ("cpu_fit", "single"),
        # importing torch_xla first does not help: only a started runtime reports XLA devices to autograd
        ("import_then_cpu_backward", "single"),
        # `accelerator="auto"` on a TPU host
        ("cpu_fit", "auto"),
    ],
)
def test_tpu_fit_after_a_cpu_backward_trains_as_in_a_fresh_process(healthy, history, strategy, tmp_path):
    reference = healthy["first"]
    run = _run(history, strategy, tmp_path)["run"]
    assert run["strategy"] == "SingleTPUStrategy"
    assert run["weights"] == reference["weights"]
    assert run["per_step"] == reference["per_step"] == STEADY
    # the backward passes ran on the thread that trains, for this run only, and the user was told why
    assert run["multithreading"] is False
    assert run["multithreading_after"] is True
    assert _noticed(run)
    assert reference["multithreading"] is True and not _noticed(reference)


@RunIf(xla=True)
@pytest.mark.slow
def test_tpu_spawn_after_a_cpu_fit_trains_in_the_forked_process(tmp_path):
    """``xmp.spawn`` forks the training process from the main process, whose autograd state it inherits. The main
    process must not start the XLA runtime (PJRT refuses to spawn then): the check runs in the forked process."""
    fresh = _run("fresh", "spawn", tmp_path / "fresh")["run"]
    run = _run("cpu_fit", "spawn", tmp_path / "after")["run"]
    assert run["strategy"] == fresh["strategy"] == "TPUSpawnStrategy"
    assert run["weights"] == fresh["weights"]
    assert run["per_step"] == fresh["per_step"] == STEADY
    assert run["multithreading"] is False and _noticed(run)
    assert fresh["multithreading"] is True and not _noticed(fresh)
    # the main process itself was left alone
    assert run["multithreading_after"] is True


@RunIf(xla=True)
@pytest.mark.slow
def test_spmd_fit_after_a_cpu_fit_trains_as_one_device_does(healthy, tmp_path):
    reference = healthy["first"]
    run = _run("cpu_fit", "xla_spmd", tmp_path, devices=4)["run"]
    assert run["strategy"] == "XLASPMDStrategy"
    assert _max_difference(run["weights"], reference["weights"]) < SPMD_TOLERANCE
    assert run["per_step"] == reference["per_step"] == STEADY
    assert run["multithreading"] is False and run["multithreading_after"] is True and _noticed(run)


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.guard
@pytest.mark.parametrize("history", ["tpu_fit_then_cpu_fit", "runtime_then_cpu_fit"])
def test_runtime_started_before_the_first_backward_changes_nothing(healthy, history, tmp_path):
    """A process whose XLA runtime started before its first backward pass (a TPU fit first, or ``torch_xla.device()``
    first) has autograd's XLA thread: CPU fits and then TPU fits keep training there, without the notice."""
    run = healthy["run"] if history == "tpu_fit_then_cpu_fit" else _run(history, "single", tmp_path)["run"]
    assert run["weights"] == healthy["first"]["weights"]
    assert run["per_step"] == STEADY
    assert run["multithreading"] is True
    assert not _noticed(run)
