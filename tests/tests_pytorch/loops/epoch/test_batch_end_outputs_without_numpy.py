"""With one optimizer, ``on_train_batch_end`` gets the step's output dict without a round trip through NumPy.

The loop converts its per-optimizer outputs into a list, builds an object array of it, squeezes the single-element
dimensions away and turns it back into Python objects, on every batch. With one optimizer and no truncated
backpropagation that gives the step's output dict itself, so the loop now hands it over directly. Several optimizers
still go through the conversion, as before.
"""
from unittest import mock

import pytest
import torch

FIXED_BY = "0045-batch-end-outputs-without-numpy.patch"

BATCHES = 3


def _fit(tmp_path, optimizers):
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.loops.epoch import training_epoch_loop

    received = []

    class Model(BoringModel):
        def training_step(self, batch, batch_idx, optimizer_idx=None):
            out = super().training_step(batch, batch_idx)
            out["extra"] = batch_idx
            return out

        def configure_optimizers(self):
            return [torch.optim.SGD(self.layer.parameters(), lr=0.1) for _ in range(optimizers)]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            received.append(outputs)

        def training_epoch_end(self, outputs):
            pass

    trainer = Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=BATCHES,
                      limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    np = training_epoch_loop.np
    with mock.patch.object(np, "array", wraps=np.array) as spy:
        trainer.fit(Model())
    return spy.call_count, received


def test_one_optimizer_no_numpy(tmp_path):
    calls, received = _fit(tmp_path, optimizers=1)
    # before: one object array per batch
    assert calls == 0
    assert [set(out) for out in received] == [{"loss", "extra"}] * BATCHES


@pytest.mark.guard
def test_the_outputs_of_one_optimizer_are_the_step_output(tmp_path):
    _, received = _fit(tmp_path, optimizers=1)
    assert [out["extra"] for out in received] == list(range(BATCHES))
    for out in received:
        assert isinstance(out, dict) and out["loss"].grad_fn is None and out["loss"].dim() == 0


@pytest.mark.guard
def test_two_optimizers_get_a_list_as_before(tmp_path):
    _, received = _fit(tmp_path, optimizers=2)
    assert len(received) == BATCHES
    for batch_idx, out in enumerate(received):
        assert isinstance(out, list) and len(out) == 2
        assert [o["extra"] for o in out] == [batch_idx, batch_idx]
