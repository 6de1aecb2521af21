"""Logging on XLA does not force a graph execution: one graph per step, host copies deferred (fix
`defer-host-transfer-of-logged-xla-values`)."""
from typing import Dict, List

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf

FIXED_BY = "0010-defer-host-transfer-of-logged-xla-values.patch"


def _data(n: int = 48) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    # uneven last batch: the `batch_size`-weighted epoch mean must still match
    return DataLoader(TensorDataset(x, y), batch_size=5)


def _module(sync_dist: bool = False):
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

        def _loss(self, batch):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch)
            n = batch[0].shape[0]
            self.log("train_loss", loss, prog_bar=True)
            self.log("loss_sum", loss, on_step=True, on_epoch=True, reduce_fx="sum", batch_size=n, sync_dist=sync_dist)
            self.log("loss_max", loss * 2, on_step=False, on_epoch=True, reduce_fx="max")
            self.log("loss_mean", loss + 1, on_step=True, on_epoch=True, batch_size=n)
            return loss

        def validation_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("val_loss", loss, batch_size=batch[0].shape[0])
            self.log("val_max", loss.detach() * 3, reduce_fx="max")

        def test_step(self, batch, batch_idx):
            loss = self._loss(batch)
            self.log("test_loss", loss, batch_size=batch[0].shape[0])
            self.log("test_sum", loss + 2, reduce_fx="sum")

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Model()


class _MemoryLogger:
    """A logger that keeps what it is given."""

    def __new__(cls):
        from pytorch_lightning.loggers.logger import Logger

        class Memory(Logger):
            def __init__(self):
                super().__init__()
                self.rows: List[Dict[str, float]] = []

            @property
            def name(self):
                return "memory"

            @property
            def version(self):
                return 0

            def log_metrics(self, metrics, step=None):
                self.rows.append({k: float(v) for k, v in metrics.items()})

            def log_hyperparams(self, *args, **kwargs):
                pass

        return Memory()


def _counting_callback(xla_metrics, rows):
    from pytorch_lightning import Callback

    def snapshot():
        rows.append((xla_metrics.compiles(), xla_metrics.executions(), xla_metrics.transfers()))

    class Count(Callback):
        def on_train_batch_end(self, *args):
            snapshot()

        def on_validation_batch_end(self, *args):
            snapshot()

        def on_test_batch_end(self, *args):
            snapshot()

    return Count()


def _per_step(rows, start):
    return [tuple(b[i] - a[i] for i in range(3)) for a, b in zip(rows[start:], rows[start + 1:])]


@RunIf(xla=True)
def test_a_training_step_that_logs_runs_one_graph(tmp_path, xla_metrics):
    """Loss on the progress bar every step, three more logged values, the running loss, the progress bar on:
    0 compilations and exactly 1 graph execution per steady step (the transfers: test_xla_running_loss_one_transfer)."""
    from pytorch_lightning import Trainer

    rows = []
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=30, default_root_dir=tmp_path, logger=_MemoryLogger(),
                      log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False,
                      limit_val_batches=0, callbacks=[_counting_callback(xla_metrics, rows)])
    data = DataLoader(_data(30 * 5).dataset, batch_size=5)
    trainer.fit(_module(), data)
    steady = _per_step(rows, 10)
    assert {s[0] for s in steady} == {0}, f"compilations per step: {steady}"
    assert {s[1] for s in steady} == {1}, f"executions per step: {steady}"


@RunIf(xla=True)
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_an_evaluation_step_that_logs_runs_one_graph(tmp_path, xla_metrics, stage):
    from pytorch_lightning import Trainer

    rows = []
    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False,
                      enable_model_summary=False, enable_progress_bar=False,
                      callbacks=[_counting_callback(xla_metrics, rows)])
    getattr(trainer, stage)(_module(), DataLoader(_data(60).dataset, batch_size=5))
    steady = _per_step(rows, 4)
    assert {s[1] for s in steady} == {1}, f"executions per {stage} step: {steady}"
    assert {s[0] for s in steady} == {0}, f"compilations per {stage} step: {steady}"


def _run_all(accelerator: str, tmp_path, sync_dist: bool = False):
    from pytorch_lightning import seed_everything, Trainer

    seed_everything(0)
    logger = _MemoryLogger()
    trainer = Trainer(accelerator=accelerator, devices=1, max_epochs=2, default_root_dir=tmp_path / accelerator,
                      logger=logger, log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False,
                      enable_progress_bar=False)
    model = _module(sync_dist=sync_dist)
    trainer.fit(model, _data(), _data(20))
    fit_metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    bar = dict(trainer.progress_bar_metrics)
    tested = trainer.test(model, _data(20), verbose=False)[0]
    return fit_metrics, bar, logger.rows, tested


@pytest.mark.guard  # the values were right before the fix; deferring their host copy must not change them
@RunIf(xla=True)
@pytest.mark.parametrize("sync_dist", [False, True], ids=["deferred", "sync_dist"])
def test_logged_values_equal_those_of_the_cpu_accelerator(tmp_path, sync_dist):
    xla = _run_all("tpu", tmp_path, sync_dist)
    cpu = _run_all("cpu", tmp_path, sync_dist)
    for got, want in zip(xla[:2], cpu[:2]):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), key
    # the loggers saw the same rows, step by step (on_step values, epoch reductions, validation)
    assert len(xla[2]) == len(cpu[2])
    for got, want in zip(xla[2], cpu[2]):
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-5), key
    assert xla[3].keys() == cpu[3].keys()
    for key in cpu[3]:
        assert xla[3][key] == pytest.approx(cpu[3][key], rel=1e-4, abs=1e-5), key


@RunIf(xla=True)
def test_host_transfers_are_deferred_batched_and_in_order(xla_metrics):
    import torch_xla
    import torch_xla.core.xla_model as xm

    from pytorch_lightning.utilities.xla_host_transfers import _XLAHostTransfers

    device = torch_xla.device()
    queue = _XLAHostTransfers()
    got = []
    a = torch.arange(3.0, device=device) * 2
    queue.defer(a.sum(), lambda v: got.append(("sum", v)))
    queue.defer(a.max(), lambda v: got.append(("max", v)))
    xm.mark_step()
    xla_metrics.clear()
    assert got == [] and len(queue) == 2  # nothing is copied until someone needs a value
    extra = queue.fetch(a.mean())
    assert [name for name, _ in got] == ["sum", "max"]
    assert [float(v) for _, v in got] == [6.0, 4.0] and float(extra) == 2.0
    assert got[0][1].device.type == "cpu" and extra.device.type == "cpu"
    assert xla_metrics.transfers() == 1  # three values, one transfer
    queue.flush()  # nothing left: no transfer
    assert xla_metrics.transfers() == 1 and len(queue) == 0
