"""SPMD on every chip of a Cloud TPU VM: the Trainer's ``xla_spmd`` and ``xla_spmd_fsdp`` against one TPU device.

Needs real TPU hardware (the XLA:CPU versions of these checks are tests_pytorch/strategies/test_xla_spmd*.py). Each
run is a process of its own, one after the other (a TPU is opened by one process at a time): the reference on one
device, then each strategy on every device of the host, 12 steps with ``gradient_clip_val`` and a progress-bar loss
on the same global batches. Matrix products run at full float32 precision (``set_mat_mul_precision("highest")``;
a TPU's default rounds their inputs to bfloat16), so the weights agree to float32 rounding across the partitioned
sums.
"""
import os

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

FIXED_BY = "0051-feature-xla-spmd-fsdp-strategy.patch"

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOLERANCE = 1e-4

_RUN = """
import sys
sys.path.insert(0, {tests!r})
import torch_xla.backends
torch_xla.backends.set_mat_mul_precision("highest")
import torch_xla.runtime as xr
from helpers.xla_spmd_runs import trainer_run
run = trainer_run("clip", {strategy!r}, {tmp!r})
run["devices"] = xr.global_runtime_device_count()
emit(run)
"""


@pytest.fixture(scope="module")
def tpu_runs(tmp_path_factory):
    runs = {}
    for strategy in (None, "xla_spmd", "xla_spmd_fsdp"):
        tmp = tmp_path_factory.mktemp(strategy or "one_device")
        code = _RUN.format(tests=TESTS_DIR, strategy=strategy, tmp=str(tmp))
        runs[strategy] = run_python(code, env={"PJRT_DEVICE": "TPU", "CPU_NUM_DEVICES": None}, timeout=600)
    return runs


def _max_difference(a, b):
    return max((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max().item() for k in a)


@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
@RunIf(tpu=True)
def test_spmd_on_every_tpu_chip_trains_like_one_device(tpu_runs, strategy):
    ref, run = tpu_runs[None], tpu_runs[strategy]
    assert run["devices"] > 1
    assert _max_difference(ref["weights"], run["weights"]) < TOLERANCE
    assert run["train"] == {"compiles": 0, "executions": 1, "transfers": 1}
    assert run["val"]["compiles"] == 0 and run["val"]["executions"] == 1
    shards = {name: len(info["shards"]) for name, info in run["sharding"].items()}
    assert set(shards.values()) == {run["devices"]}
    if strategy == "xla_spmd_fsdp":
        assert all(info["spec"].startswith("{devices=") for info in run["sharding"].values())
    else:
        assert all(info["spec"] == "{replicated}" for info in run["sharding"].values())
