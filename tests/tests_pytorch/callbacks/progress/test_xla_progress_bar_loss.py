"""The training bar on XLA shows a ``loss`` at every step, as it does without XLA.

The step's loss comes to the host on Lightning's copying thread, and the bar shows the losses that arrived, one
step behind, without waiting for the device. At the first step of a run none has arrived yet: the bar then waits for
it once, instead of showing no ``loss`` (callbacks and subclasses of the bar read that key) or a ``nan``. At the end
of an epoch every loss of the epoch is in.
"""
import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0060-xla-host-copies-off-the-training-thread.patch"


@pytest.mark.guard  # true before the copies moved to a thread too: the loss was copied at the end of its step
@RunIf(xla=True)
def test_the_bar_shows_a_loss_at_every_step_and_the_epoch_s_at_its_end(tmp_path):
    from pytorch_lightning import Trainer, seed_everything
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.demos.boring_classes import BoringModel

    seed_everything(3)
    shown, step_losses = [], []

    class Bar(TQDMProgressBar):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            step_losses.append(outputs["loss"])
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

        def get_metrics(self, trainer, pl_module):
            items = super().get_metrics(trainer, pl_module)
            shown.append((trainer.state.stage.value, trainer.global_step, items.get("loss")))
            return items

    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False, max_epochs=1,
                      limit_train_batches=4, limit_val_batches=0, enable_checkpointing=False,
                      enable_model_summary=False, callbacks=[Bar(refresh_rate=1)])
    trainer.fit(BoringModel())

    losses = [float(loss) for loss in step_losses]
    train = [(step, loss) for stage, step, loss in shown if stage == "train"]
    # one per step, and one at the end of the epoch
    assert [step for step, _ in train] == [1, 2, 3, 4, 4]
    assert all(loss is not None and loss != "nan" for _, loss in train), train
    # the first step's loss, waited for once; then the losses that arrived; at the epoch's end all of its own
    assert train[0][1] == f"{losses[0]:.3g}"
    assert train[-1][1] == f"{torch.tensor(losses).mean().item():.3g}"
