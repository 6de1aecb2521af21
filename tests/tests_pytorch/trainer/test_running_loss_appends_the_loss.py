"""The running loss takes each batch's loss as it is: no one-element buffer and no mean of it on the way.

Its values stay those of 1.8.6: the batch's loss as a float32 scalar, multiplied back by ``accumulate_grad_batches``.
"""
import sys

import pytest

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0037-running-loss-takes-the-batch-loss-directly.patch"


def _fit(tmp_path, accumulate):
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.trainer.supporters import TensorRunningAccum

    means = []
    running = []
    losses = []

    class Model(BoringModel):
        def on_train_batch_start(self, batch, batch_idx):
            if batch_idx == 4:
                sys.setprofile(tracer)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx == 4:
                sys.setprofile(None)
            losses.append(float(outputs["loss"]))

    code = TensorRunningAccum._agg_memory.__code__

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code:
            means.append(frame.f_locals["how"])

    try:
        trainer = fit_on_xla(Model(), tmp_path, max_steps=6 // accumulate, limit_train_batches=6,
                             accumulate_grad_batches=accumulate)
    finally:
        sys.setprofile(None)
    # what the running loss holds once the run ended (on XLA a batch's loss reaches it one step later): its window
    # of 20 holds every batch's value, in order
    running.extend(trainer.fit_loop.running_loss.memory[:6])
    return means, running, losses


@RunIf(xla=True)
@pytest.mark.parametrize("accumulate", [1, 3])
def test_running_loss_takes_the_batch_loss_without_a_mean(tmp_path, accumulate):
    means, running, losses = _fit(tmp_path, accumulate)
    # no mean in the batch loop (no progress bar here reads the running mean)
    assert means == [], means
    assert len(running) == 6
    for value, loss in zip(running, losses):
        # a float32 scalar on the host, the batch's loss multiplied back by the accumulation
        assert value.device.type == "cpu" and value.dtype.is_floating_point and value.dim() == 0
        assert float(value) == pytest.approx(loss * accumulate, rel=1e-6)
