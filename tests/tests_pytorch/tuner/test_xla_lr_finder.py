"""The learning-rate finder on XLA reads each step's own loss.

Its callback reads ``trainer.fit_loop.running_loss.last()`` in ``on_train_batch_end``. On XLA the step's loss comes
to the host on Lightning's copying thread, one step later for the progress bar and the loggers; a read of the
running loss waits for the copies already in flight instead, so that it sees the step that just ended, as it does
without XLA. Before that, the first read found no loss (``lr_find`` failed on an assertion) and every later one the
previous step's.
"""
import pytest

from helpers.runif import RunIf
from helpers.xla_classifier import xla_trainer

FIXED_BY = "0060-xla-host-copies-off-the-training-thread.patch"

STEPS = 20


def _model(step_losses):
    import torch
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def __init__(self):
            super().__init__()
            self.lr = 0.01

        def on_train_batch_end(self, outputs, batch, batch_idx):
            # the step's own loss, kept on the device and read after the run (`lr_find` runs its own callback only)
            step_losses.append(outputs["loss"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    return Model()



@pytest.mark.guard  # true before the copies moved to a thread too: the loss was copied at the end of its step
@RunIf(xla=True)
def test_lr_find_records_every_step_s_own_loss_and_suggests_a_rate(tmp_path):
    from pytorch_lightning import seed_everything

    seed_everything(7)
    step_losses = []
    trainer = xla_trainer(tmp_path, callbacks=[])
    finder = trainer.tuner.lr_find(_model(step_losses), num_training=STEPS, early_stop_threshold=None)

    assert len(step_losses) == STEPS
    # the finder's record is its smoothing of the steps' own losses, step for step
    beta, avg, expected = 0.98, 0.0, []
    for step, loss in enumerate(step_losses, start=1):
        avg = beta * avg + (1 - beta) * float(loss)
        expected.append(avg / (1 - beta ** (step + 1)))
    assert finder.results["loss"] == expected
    assert len(finder.results["lr"]) == STEPS
    assert finder.suggestion() is not None


@pytest.mark.guard  # true before the copies moved to a thread too
@RunIf(xla=True)
def test_the_running_loss_read_in_a_hook_is_the_step_s_loss(tmp_path):
    """Every read of the running loss in ``on_train_batch_end`` gives that step's loss, also at the first step."""
    from pytorch_lightning import Callback, seed_everything

    seed_everything(7)
    read, step_losses = [], []

    class ReadRunningLoss(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            last = trainer.fit_loop.running_loss.last()
            read.append(None if last is None else last.item())

    trainer = xla_trainer(tmp_path, callbacks=[ReadRunningLoss()], max_steps=5, limit_val_batches=0)
    trainer.fit(_model(step_losses))
    assert read == [float(loss) for loss in step_losses]
    assert len(read) == 5
