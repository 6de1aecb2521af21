"""The training step's loss is divided by ``accumulate_grad_batches`` only when it is more than 1.

A division by 1 changes no value but is one more tensor operation every step (on XLA, one more node traced into
every step's graph). With accumulation the loss is still normalized, and in both cases training gives the same
weights as before.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

FIXED_BY = "0039-loss-divided-only-when-accumulating.patch"

BATCHES = 4


class _CountDivisions(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.divisions = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.div:
            self.divisions += 1
        return func(*args, **(kwargs or {}))


def _fit(tmp_path, accumulate):
    from pytorch_lightning import Trainer, seed_everything
    from pytorch_lightning.demos.boring_classes import BoringModel

    seed_everything(3)
    mode = _CountDivisions()
    losses = []

    class Model(BoringModel):
        def on_train_batch_start(self, batch, batch_idx):
            mode.__enter__()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            mode.__exit__(None, None, None)
            losses.append(outputs["loss"].clone())

    model = Model()
    trainer = Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        accumulate_grad_batches=accumulate,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model)
    return mode.divisions, losses, model


def test_no_division_without_accumulation(tmp_path):
    divisions, _, _ = _fit(tmp_path, accumulate=1)
    # the model's own step has no division: two per batch were the loss divided by 1 and that division's backward
    assert divisions == 0


@pytest.mark.guard
def test_accumulated_loss_is_still_normalized(tmp_path):
    divisions, losses, model = _fit(tmp_path / "acc", accumulate=2)
    # each batch's loss divided by 2, and that division's backward
    assert divisions == 2 * BATCHES
    _, plain_losses, _ = _fit(tmp_path / "plain", accumulate=1)
    # the first batch sees the same weights either way: with accumulation its loss is reported divided by 2
    assert torch.equal(losses[0] * 2, plain_losses[0])
    assert all(torch.isfinite(p).all() for p in model.parameters())
