"""The fix `xla-logged-torchmetrics-stay-on-the-device` keeps logged torchmetrics objects on the module's device
(``_ResultCollection._metric_device``); that device is not part of the state the collection saves, so loop
checkpoints keep upstream's format, and a run resumed from one logs its torchmetrics object on the XLA device again.
"""
import inspect

import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0012-xla-logged-torchmetrics-stay-on-the-device.patch"

# what upstream 1.8.6's `_ResultCollection.state_dict()` holds (tests_pytorch/loops/test_loop_state_dict.py)
UPSTREAM_KEYS = {"training", "device", "batch", "batch_size", "dataloader_idx", "items"}
BATCHES = 4
CLASSES = 3


def _collection_with_a_logged_metric(device):
    import torchmetrics

    from pytorch_lightning.trainer.connectors.logger_connector.result import _ResultCollection

    results = _ResultCollection(training=True)
    results.to(device=device)
    metric = torchmetrics.SumMetric().to(device)
    metric(torch.tensor(2.0, device=device))
    results.log("training_step", "total", metric, on_step=False, on_epoch=True, metric_attribute="metric",
                batch_size=1)
    results.log("training_step", "loss", torch.tensor(1.5, device=device), on_step=True, on_epoch=True, batch_size=1)
    return results, metric


@RunIf(xla=True)
def test_saved_state_has_upstreams_keys_and_loads_onto_the_device():
    import torch_xla

    from pytorch_lightning.trainer.connectors.logger_connector.result import _ResultCollection, _Sync

    device = torch_xla.device()
    results, metric = _collection_with_a_logged_metric(device)
    assert results._metric_device == device
    state = results.state_dict()
    assert set(state) == UPSTREAM_KEYS
    # the values the collection holds are on the host (fix `result-collection-stays-on-cpu-for-xla`); the device of
    # the module is not saved
    assert state["device"] == torch.device("cpu")

    # loaded with a device, the logged metric goes there (the sync function is the one `log` passes, as the loops do)
    resumed = _ResultCollection(training=True)
    resumed.load_state_dict(state, map_location=device, metrics={"metric": metric}, sync_fn=_Sync.no_op)
    assert resumed._metric_device == device
    metric(torch.tensor(3.0, device=device))
    resumed.log("training_step", "total", metric, on_step=False, on_epoch=True, metric_attribute="metric",
                batch_size=1)
    assert metric.sum_value.device.type == "xla"
    assert float(resumed.metrics(on_step=False)["callback"]["total"]) == 5.0

    # restored without `__init__` (as unpickling does) and without a device: the collection's own, until a run
    # moves it with `to(device=...)`
    bare = _ResultCollection.__new__(_ResultCollection)
    bare.__setstate__(state)
    assert bare._metric_device == torch.device("cpu")
    bare.to(device=device)
    assert bare._metric_device == device


def _module(seen):
    import torchmetrics

    from pytorch_lightning import LightningModule

    class Classifier(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Linear(8, CLASSES)
            self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            self.train_acc(logits, y)
            self.log("train_acc", self.train_acc, on_step=True, on_epoch=True)
            seen.append((self.current_epoch, self.train_acc.tp.device.type))
            return torch.nn.functional.cross_entropy(logits, y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(5)
            x = torch.randn(BATCHES * 4, 8, generator=g)
            y = torch.randint(0, CLASSES, (len(x),), generator=g)
            return torch.utils.data.DataLoader(list(zip(x, y)), batch_size=4)

    return Classifier()


def _trusted(load_fn) -> dict:
    """``weights_only=False`` where ``load_fn`` takes it.

    torch >= 2.6 loads with its safe unpickler, which refuses the torchmetrics functions that the loops' state of a
    logged metric names; the checkpoints are the test's own. Where Lightning does not choose (upstream 1.8.6),
    ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` (set by the test) makes torch load them without it.
    """
    return {"weights_only": False} if "weights_only" in inspect.signature(load_fn).parameters else {}


def _fit(root, accelerator, max_epochs, ckpt_path=None, seen=None):
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint

    seen = [] if seen is None else seen
    checkpoint = ModelCheckpoint(dirpath=str(root), save_last=True)
    trainer = Trainer(accelerator=accelerator, devices=1, max_epochs=max_epochs, default_root_dir=str(root),
                      logger=False, enable_model_summary=False, enable_progress_bar=False, callbacks=[checkpoint])
    trainer.fit(_module(seen), ckpt_path=ckpt_path, **(_trusted(trainer.fit) if ckpt_path else {}))
    return trainer, checkpoint


def _interrupted(root, accelerator, seen=None):
    """One epoch, then a second one resumed from the first one's checkpoint."""
    _, checkpoint = _fit(root / "first", accelerator, max_epochs=1)
    resumed, _ = _fit(root / "resumed", accelerator, max_epochs=2, ckpt_path=checkpoint.last_model_path, seen=seen)
    return checkpoint.last_model_path, resumed


@RunIf(xla=True)
def test_loop_checkpoint_keeps_upstreams_format_and_a_resumed_run_logs_on_the_device(tmp_path, monkeypatch):
    from lightning_lite.utilities.cloud_io import _load

    # the loops save their result collections in fault-tolerant mode only. This fix goes upstream, where the mode runs
    # on XLA; the fork's exact resume refuses it there (and needs no result collections), so the refusal is let pass
    monkeypatch.setenv("PL_FAULT_TOLERANT_TRAINING", "1")
    monkeypatch.setattr("pytorch_lightning.trainer.trainer.refuse_fault_tolerant_training", lambda _: None,
                        raising=False)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    seen = []
    path, resumed = _interrupted(tmp_path / "xla", "tpu", seen)
    fit_loop = _load(path, **_trusted(_load))["loops"]["fit_loop"]
    for key in ("epoch_loop._results", "epoch_loop.val_loop._results"):
        assert set(fit_loop[key]) == UPSTREAM_KEYS, key
    assert "training_step.train_acc" in fit_loop["epoch_loop._results"]["items"]

    # the resumed run trained the second epoch with its metric on the XLA device, and logged what the same
    # interrupted run logs on the CPU
    assert seen and {epoch for epoch, _ in seen} == {1} and {kind for _, kind in seen} == {"xla"}
    _, on_cpu = _interrupted(tmp_path / "cpu", "cpu")
    for key in ("train_acc_step", "train_acc_epoch"):
        assert key in resumed.callback_metrics, sorted(resumed.callback_metrics)
        assert float(resumed.callback_metrics[key]) == pytest.approx(float(on_cpu.callback_metrics[key]), abs=1e-6)
