"""``TPUSpawnStrategy.reduce`` (what ``self.log(..., sync_dist=True)`` calls) all-reduces inside the lazy graph.

One XLA:CPU device with a simulated world size of 2 (``xr.world_size`` patched): torch_xla's all-reduce then sums
over the one replica and the mean halves the value, which shows the reduce took effect. Before the fix the reduce
went through ``xm.mesh_reduce``: a ``torch_xla.sync()`` in the middle of the step and host round trips.
"""
import torch

from helpers.runif import RunIf

FIXED_BY = "0019-xla-sync-dist-reduces-inside-the-step-graph.patch"


@RunIf(xla=True)
def test_reduce_adds_no_execution_and_no_transfer(monkeypatch, xla_metrics):
    import torch_xla
    import torch_xla.runtime as xr

    from pytorch_lightning.strategies import TPUSpawnStrategy

    strategy = TPUSpawnStrategy()
    strategy._launched = True
    monkeypatch.setattr(xr, "world_size", lambda: 2)
    assert strategy.is_distributed
    device = torch_xla.device()
    x = torch.arange(4.0, device=device)
    value = (x * 3).sum()  # pending: nothing ran yet
    xla_metrics.clear()
    reduced = strategy.reduce(value, reduce_op="mean")
    # the reduce joins the pending graph: no graph ran, nothing came to the host
    assert (xla_metrics.executions(), xla_metrics.transfers()) == (0, 0)
    assert reduced.device.type == "xla"
    # a sum over the one real replica, scaled by 1/2: the mean of a world of 2 was applied
    assert float(reduced) == 9.0
