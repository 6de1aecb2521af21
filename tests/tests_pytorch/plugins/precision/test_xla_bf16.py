"""``precision="bf16"`` on XLA computes in bfloat16, in any process and for every Trainer (fix 0013).

The old plugin set ``XLA_USE_BF16``, which torch_xla reads once, at the first XLA tensor of the process: once the
runtime was up (a second Trainer, a notebook, this test session) training silently ran in float32.
"""
import os

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0013-xla-bf16-converts-the-module.patch"


def _module(record):
    from pytorch_lightning import LightningModule

    class Regression(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            import torch_xla

            record.setdefault("hlo", torch_xla._XLAC._get_xla_tensors_hlo([loss]))
            record.setdefault("input_dtype", x.dtype)
            record.setdefault("new_tensor_dtype", torch.ones(1).dtype)
            record.setdefault("losses", []).append(loss.detach())
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            record.setdefault("val_input_dtype", x.dtype)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(1)
            x = torch.randn(256, 8, generator=g)
            y = x.sum(dim=1, keepdim=True) * 0.3
            return torch.utils.data.DataLoader(list(zip(x, y)), batch_size=16)

        val_dataloader = train_dataloader

    return Regression()


@RunIf(xla=True)
def test_trainer_bf16_computes_in_bfloat16_and_learns(tmp_path):
    record = {}
    module = _module(record)
    trainer = fit_on_xla(module, tmp_path, precision="bf16", max_epochs=3, limit_val_batches=2)
    # the step graph computes in bf16 (the runtime of this process started long before this Trainer)
    assert "bf16" in record["hlo"], record["hlo"][:2000]
    assert record["input_dtype"] == torch.bfloat16 and record["val_input_dtype"] == torch.bfloat16
    assert record["new_tensor_dtype"] == torch.bfloat16
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    assert "XLA_USE_BF16" not in os.environ
    # the default dtype is back to float32 outside the steps
    assert torch.get_default_dtype() == torch.float32
    losses = [float(v) for v in record["losses"]]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    assert trainer.state.finished
