"""A torchmetrics object logged with ``self.log`` stays on the XLA device and costs no extra graph (fix
`xla-logged-torchmetrics-stay-on-the-device`).

Counts are per step in the steady state, on a real XLA device; the logged values must equal those of the same run
with ``accelerator="cpu"``.
"""
from typing import Dict, List

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_metrics import XLACounters

FIXED_BY = "0012-xla-logged-torchmetrics-stay-on-the-device.patch"

STEPS = 16
WARM_UP = 6
CLASSES = 4


def _data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(STEPS * 8, 16, generator=g)
    y = torch.randint(0, CLASSES, (len(x),), generator=g)
    return torch.utils.data.DataLoader(list(zip(x, y)), batch_size=8)


def _module(on_step: bool, on_epoch: bool, seen: Dict[str, List[str]]):
    import torchmetrics

    from pytorch_lightning import LightningModule

    class Classifier(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, CLASSES))
            self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)
            self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            self.train_acc(logits, y)
            self.log("train_acc", self.train_acc, on_step=on_step, on_epoch=on_epoch)
            seen.setdefault("train_acc_state", []).append(self.train_acc.tp.device.type)
            return torch.nn.functional.cross_entropy(logits, y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.val_acc(self.net(x), y)
            self.log("val_acc", self.val_acc)
            seen.setdefault("val_acc_state", []).append(self.val_acc.tp.device.type)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

        def train_dataloader(self):
            return _data()

        def val_dataloader(self):
            return _data()

    return Classifier()


class _Counter:
    """Graphs executed and device-to-host transfers per batch from ``WARM_UP`` on, for training and validation."""

    def __init__(self):
        from pytorch_lightning import Callback

        counters = XLACounters()

        def snap():
            return [counters.compiles(), counters.executions(), counters.transfers()]

        counts = self.counts = {}
        marks = {}

        class Count(Callback):
            def _start(self, phase, batch_idx):
                if batch_idx == WARM_UP:
                    marks[phase] = snap()
                marks[phase + "_n"] = batch_idx + 1 - WARM_UP

            def _end(self, phase):
                if phase in marks and phase not in counts:
                    counts[phase] = [(b - a) / marks[phase + "_n"] for a, b in zip(marks[phase], snap())]

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
                self._start("train", batch_idx)

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                if batch_idx == STEPS - 1:
                    self._end("train")

            def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
                self._start("val", batch_idx)

            def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
                if batch_idx == STEPS - 1:
                    self._end("val")

        self.callback = Count()


def _fit(tmp_path, accelerator: str, on_step: bool, on_epoch: bool, callbacks=()):
    from pytorch_lightning import Trainer

    seen: Dict[str, List[str]] = {}
    module = _module(on_step, on_epoch, seen)
    trainer = Trainer(accelerator=accelerator, devices=1, max_epochs=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0,
                      callbacks=list(callbacks))
    trainer.fit(module)
    return trainer, seen


@pytest.mark.parametrize("on_step, on_epoch", [(True, True), (False, True), (True, False)],
                         ids=["on_step+on_epoch", "on_epoch", "on_step"])
@RunIf(xla=True)
def test_logged_metric_costs_one_graph_and_one_transfer_per_step(tmp_path, on_step, on_epoch):
    counter = _Counter()
    trainer, seen = _fit(tmp_path, "tpu", on_step, on_epoch, callbacks=[counter.callback])
    compiles, executions, transfers = counter.counts["train"]
    assert (compiles, executions) == (0, 1), counter.counts
    assert transfers <= 1, counter.counts
    # per validation batch: the step's graph, and nothing copied (the metric is logged on_epoch there)
    compiles, executions, transfers = counter.counts["val"]
    assert (compiles, executions, transfers) == (0, 1, 0), counter.counts
    # the metric states stayed on the device the whole time
    assert set(seen["train_acc_state"]) == {"xla"} and set(seen["val_acc_state"]) == {"xla"}
    # the logged values reached the Trainer as host tensors
    assert all(v.device.type == "cpu" for v in trainer.callback_metrics.values())


@pytest.mark.guard  # the values were right before the fix, only slow
@RunIf(xla=True)
def test_logged_metric_values_equal_a_cpu_run(tmp_path):
    xla, _ = _fit(tmp_path / "xla", "tpu", True, True)
    cpu, _ = _fit(tmp_path / "cpu", "cpu", True, True)
    for key in ("train_acc_step", "train_acc_epoch", "val_acc"):
        assert key in xla.callback_metrics, sorted(xla.callback_metrics)
        assert float(xla.callback_metrics[key]) == pytest.approx(float(cpu.callback_metrics[key]), abs=1e-6), key
