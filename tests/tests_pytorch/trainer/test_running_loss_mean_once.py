"""The running loss takes the mean of the accumulated losses once per optimizer step, and keeps its values."""
import sys

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla


def _fit(tmp_path, accumulate):
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.trainer.supporters import TensorRunningAccum

    means = []
    running = []

    class Model(BoringModel):
        def on_train_batch_start(self, batch, batch_idx):
            if batch_idx == 4:
                sys.setprofile(tracer)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx == 4:
                sys.setprofile(None)
            running.append(float(self.trainer.fit_loop.running_loss.last()))

    code = TensorRunningAccum._agg_memory.__code__

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code:
            means.append(frame.f_locals["how"])

    try:
        fit_on_xla(Model(), tmp_path, max_steps=6 // accumulate, limit_train_batches=6,
                   accumulate_grad_batches=accumulate)
    finally:
        sys.setprofile(None)
    return means, running


@RunIf(xla=True)
def test_accumulated_loss_mean_taken_once(tmp_path):
    means, running = _fit(tmp_path, 1)
    # the batch loop's mean of the accumulated loss: once (no progress bar here reads the running mean)
    assert means == ["mean"], means
    assert len(running) == 6 and all(r == r for r in running)
