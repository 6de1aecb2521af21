"""After every batch the training loop updates the learning rate schedulers; with none configured, it now returns
before it works out which optimizers are active (a pass over the optimizers and their frequencies for nothing).
With schedulers, each still steps as before."""
from unittest import mock

import pytest
import torch

FIXED_BY = "0042-lr-schedulers-not-looked-up-without-schedulers.patch"

BATCHES = 5


def _fit(tmp_path, with_scheduler):
    from pytorch_lightning import Trainer, seed_everything
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.loops.epoch import training_epoch_loop

    seed_everything(1)
    lrs = []

    class Model(BoringModel):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            if not with_scheduler:
                return opt
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        def on_train_batch_end(self, outputs, batch, batch_idx):
            lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    trainer = Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=BATCHES,
                      limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    active = training_epoch_loop._get_active_optimizers
    with mock.patch.object(training_epoch_loop, "_get_active_optimizers", wraps=active) as spy:
        trainer.fit(Model())
    return spy.call_count, lrs


def test_no_scheduler_no_lookup(tmp_path):
    calls, lrs = _fit(tmp_path, with_scheduler=False)
    # before: once per batch (the "step" update) and once at the epoch's end
    assert calls == 0
    assert lrs == [0.1] * BATCHES


@pytest.mark.guard
def test_a_scheduler_steps_as_before(tmp_path):
    calls, lrs = _fit(tmp_path, with_scheduler=True)
    assert calls >= BATCHES
    # StepLR(step_size=2, gamma=0.5), stepped after every batch (the module's `on_train_batch_end` runs after it)
    assert lrs == pytest.approx([0.1, 0.05, 0.05, 0.025, 0.025])
