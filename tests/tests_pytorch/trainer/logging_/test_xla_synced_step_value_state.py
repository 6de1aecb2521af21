"""The fix `xla-synced-step-values-join-the-deferred-transfer` hands a step value logged with ``sync_dist=True`` on
XLA to its ``_ResultMetric`` already synced (``_synced_step_value``); that attribute only lives between ``log`` and
the update that takes it, and is not part of the state the metric saves, which keeps upstream's keys.
"""
import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0025-xla-synced-step-values-join-the-deferred-transfer.patch"


def _identity_sync(value, reduce_op=None, group=None):
    return value


@pytest.mark.guard  # upstream's state has no such key; the first version of the fix saved it
@RunIf(xla=True)
def test_saved_metric_state_has_no_synced_step_value_and_reloads():
    import torch_xla

    from pytorch_lightning.trainer.connectors.logger_connector.result import _ResultCollection, _ResultMetric

    device = torch_xla.device()
    results = _ResultCollection(training=True)
    results.to(device=device)
    for value in (1.0, 3.0):
        results.log("training_step", "loss", torch.tensor(value, device=device), on_step=True, on_epoch=True,
                    sync_dist=True, sync_dist_fn=_identity_sync, batch_size=1)
    state = results.state_dict()
    item = state["items"]["training_step.loss"]
    assert "_synced_step_value" not in item
    # what upstream's `_ResultMetric` saves for a tensor logged on_step and on_epoch: its own attributes plus the
    # torchmetrics `Metric` ones, the same on both sides
    upstream_own = {"is_tensor", "meta", "has_reset", "value", "cumulated_batch_size", "_forward_cache", "_class",
                    "_is_synced"}
    assert upstream_own <= set(item)

    resumed = _ResultCollection(training=True)
    resumed.load_state_dict(state, sync_fn=_identity_sync)
    resumed.to(device=device)
    resumed.log("training_step", "loss", torch.tensor(5.0, device=device), on_step=True, on_epoch=True,
                sync_dist=True, sync_dist_fn=_identity_sync, batch_size=1)
    metrics = resumed.metrics(on_step=True)["callback"]
    assert float(metrics["loss_step"]) == 5.0
    assert float(resumed.metrics(on_step=False)["callback"]["loss_epoch"]) == pytest.approx(3.0)

    # restored without `__init__` (as unpickling does), it still takes values
    bare = _ResultMetric.__new__(_ResultMetric)
    bare.__setstate__(item, sync_fn=_identity_sync)
    bare.forward(torch.tensor(7.0), 1)
    assert float(bare._forward_cache) == 7.0
