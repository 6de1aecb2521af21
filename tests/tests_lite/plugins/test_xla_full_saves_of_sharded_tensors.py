"""A full checkpoint of tensors sharded over the devices (SPMD, ``xla_spmd_fsdp``'s default ``state_dict_type="full"``)
copies them to the host without compiling anything.

torch_xla copies a sharded tensor to the CPU by replicating it first, with a graph it compiles again for each tensor
at each call: every full save of an FSDPv2 model compiled one graph per parameter and per optimizer state (8 for the
test runs' MLP with Adam, at every save). The save now puts each tensor together on the host from its shards.
"""
import json

import pytest

from helpers.runif import RunIf

FIXED_BY = "0086-feature-xla-spmd-full-saves-copy-shards-without-compiling.patch"

_COPY = r"""
import json, sys
import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

from lightning_lite.plugins.io.xla import _xla_tensors_to_cpu

xr.use_spmd()
device = xm.xla_device()
rows = xs.Mesh(np.arange(4), (4, 1), ("fsdp", "model"))
grid = xs.Mesh(np.arange(4), (2, 2), ("a", "b"))
torch.manual_seed(0)
expected = {
    "even": torch.randn(8, 6),
    "uneven": torch.randn(10, 3),
    "bf16 on a grid": torch.randn(6, 4, 2).to(torch.bfloat16),
    "one axis of a grid": torch.randn(7),
    "replicated": torch.randn(5, 5),
    "not sharded": torch.randn(3),
}
on_device = {k: v.to(device) for k, v in expected.items()}
xs.mark_sharding(on_device["even"], rows, ("fsdp", None))
xs.mark_sharding(on_device["uneven"], rows, ("fsdp", None))
xs.mark_sharding(on_device["bf16 on a grid"], grid, ("a", "b", None))
xs.mark_sharding(on_device["one axis of a grid"], grid, ("b",))
xs.mark_sharding(on_device["replicated"], rows, (None, None))
# the state of a step: computed, not yet run
checkpoint = {"state_dict": {k: v * 2 for k, v in on_device.items()}, "step": 3}


def count(name):
    data = met.metric_data(name)
    return data[0] if data else 0


saves = []
for _ in range(2):
    before = [count(n) for n in ("CompileTime", "ExecuteReplicatedTime")]
    copy = _xla_tensors_to_cpu(checkpoint, convert=True)
    saves.append([count(n) - b for n, b in zip(("CompileTime", "ExecuteReplicatedTime"), before)])
    assert copy["step"] == 3
    for key, value in expected.items():
        got = copy["state_dict"][key]
        assert got.device.type == "cpu" and got.dtype == value.dtype and torch.equal(got, value * 2), key
print(json.dumps(saves))
"""


@RunIf(xla=True)
def test_a_full_save_of_sharded_tensors_compiles_nothing(fork_server):
    """Shards even and uneven, bf16, over one axis of a 2 x 2 mesh and over both, beside a replicated and an unsharded
    tensor: each copy equals the tensor, and the second save runs nothing; the first runs the pending step in one
    execution, whose one compilation is the step's own."""
    proc = fork_server({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}).run(_COPY, [], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, second = json.loads(proc.stdout.strip().splitlines()[-1])
    # compilations, executions
    assert first == [1, 1]
    assert second == [0, 0]
