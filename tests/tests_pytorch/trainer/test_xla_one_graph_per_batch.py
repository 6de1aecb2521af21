"""One XLA graph per batch with gradient accumulation and in manual optimization (fix
`xla-one-graph-per-batch-with-accumulation-and-manual-optimization`).

Counts are taken on a real XLA device in the steady state; the pending IR is read without running it.
"""
import re

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_metrics import XLACounters

FIXED_BY = "0014-xla-one-graph-per-batch-with-accumulation-and-manual-optimization.patch"

BATCHES = 16
WARM_UP = 6


def _loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * 8, 16, generator=g)
    y = torch.randint(0, 4, (len(x),), generator=g)
    return torch.utils.data.DataLoader(list(zip(x, y)), batch_size=8)


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _executions_per_batch(tmp_path, module, **trainer_kwargs):
    """Graph executions per training batch after ``WARM_UP``, with the progress bar reading the loss every batch."""
    from pytorch_lightning import Callback, Trainer

    seen = {}
    executions = XLACounters().executions

    class Count(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == WARM_UP:
                seen["start"] = executions()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            # what a callback reads after the step must already be computed
            seen["weight"] = pl_module.net[0].weight.detach().cpu()
            if batch_idx == BATCHES - 1:
                seen["per_batch"] = (executions() - seen["start"]) / (BATCHES - WARM_UP)

    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, callbacks=[Count()], **trainer_kwargs)
    trainer.fit(module)
    return seen["per_batch"]


def _manual_module(n_optimizers: int, accumulate: int = 1):
    from pytorch_lightning import LightningModule

    class Manual(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            x, y = batch
            optimizers = self.optimizers()
            optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
            for opt in optimizers:
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                self.manual_backward(loss / accumulate)
                if (batch_idx + 1) % accumulate == 0:
                    opt.step()
                    opt.zero_grad()
            self.log("loss", loss, prog_bar=True)

        def configure_optimizers(self):
            if n_optimizers == 1:
                return torch.optim.SGD(self.parameters(), lr=0.1)
            return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]

        def train_dataloader(self):
            return _loader()

    return Manual()


@pytest.mark.parametrize("n_optimizers, accumulate", [(2, 1), (1, 2)], ids=["two-optimizers", "accumulate-2"])
@RunIf(xla=True)
def test_manual_optimization_runs_one_graph_per_step(tmp_path, n_optimizers, accumulate):
    per_batch = _executions_per_batch(tmp_path, _manual_module(n_optimizers, accumulate))
    assert per_batch == 1.0


@RunIf(xla=True)
def test_manual_optimization_logging_after_the_step_stays_one_graph(tmp_path):
    """One optimizer, the loss logged after ``opt.step()``: the barrier comes after the whole ``training_step``, so
    the logging is part of the step's graph (a barrier right after ``opt.step()`` left it for a second graph)."""
    assert _executions_per_batch(tmp_path, _manual_module(1)) == 1.0


def _automatic_module(record):
    from pytorch_lightning import LightningModule

    class Automatic(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss, prog_bar=True)
            return loss

        def on_before_optimizer_step(self, optimizer, optimizer_idx):
            import torch_xla

            if "ir" not in record and self.trainer.global_step >= 2:
                record["ir"] = torch_xla._XLAC._get_xla_tensors_text([p.grad for p in self.parameters()])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return _loader()

    return Automatic()


def _forward_matmuls(ir: str) -> int:
    """The matrix products of the two linear layers' forward passes in a graph (``addmm`` of input and weight)."""
    return len(re.findall(r"aten::addmm", ir))


@RunIf(xla=True)
def test_accumulation_runs_each_forward_once(tmp_path):
    """With ``accumulate_grad_batches=2`` the update's graph holds the forward of its own batch only: the
    accumulating batch's forward and backward ran in their own graph, once, and are not computed again."""
    single, accumulated = {}, {}
    _executions_per_batch(tmp_path / "1", _automatic_module(single))
    per_batch = _executions_per_batch(tmp_path / "2", _automatic_module(accumulated), accumulate_grad_batches=2)
    assert _forward_matmuls(single["ir"]) > 0, single["ir"]
    assert _forward_matmuls(accumulated["ir"]) == _forward_matmuls(single["ir"]), accumulated["ir"]
    assert per_batch == 1.0
