"""On XLA, a checkpoint written in the background has landed before anything reads it.

``ModelCheckpoint`` writes on a writer thread while training goes on. Whatever reads its files sees them whole, or
the failure of their write where it happened: ``on_train_end`` (a callback that loads or uploads
``best_model_path``), the code after a ``fit`` that Ctrl-C ended, and ``ModelCheckpoint`` itself when it names a new
file after one still being written. A preemption's checkpoint is written whatever an earlier write did.

Each write here is held for a moment on the writer thread (``_SlowWrites``), so that it is still in flight when the
reader comes: the outcome does not depend on how fast this host writes.
"""
import errno
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, List, Optional

import pytest
import torch
from torch.utils.data import DataLoader

from helpers.runif import RunIf

FIXED_BY = "0081-feature-xla-checkpoint-writes-land-before-their-readers.patch"


class _SlowWrites:
    """Each write of a checkpoint file takes ``seconds`` more; the write of a file named ``fail`` fails (ENOSPC)."""

    def __init__(self, monkeypatch: Any, seconds: float = 0.5, fail: Optional[str] = None) -> None:
        from lightning_lite.plugins.io import xla

        self.done: List[str] = []
        real = xla._atomic_write

        def write(data: bytes, path: Any) -> None:
            time.sleep(seconds)
            if fail is not None and os.path.basename(str(path)) == fail:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(data, path)
            self.done.append(os.path.basename(str(path)))

        monkeypatch.setattr(xla, "_atomic_write", write)


def _fit(tmp_path: Path, callbacks: List[Any], accelerator: str = "tpu", max_steps: int = 20,
         model: Any = None, **checkpoint: Any) -> Any:
    from pytorch_lightning import seed_everything, Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    seed_everything(7)

    class Model(BoringModel):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

    options = {"dirpath": tmp_path / "ckpts", "every_n_train_steps": 5, "save_top_k": 1, "monitor": "step",
               "mode": "max", **checkpoint}
    trainer = Trainer(accelerator=accelerator, devices=1, max_steps=max_steps, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[ModelCheckpoint(**options), *callbacks])
    trainer.fit(model if model is not None else Model())
    return trainer


@RunIf(xla=True)
def test_on_train_end_reads_the_best_checkpoint(tmp_path, monkeypatch):
    """A callback that loads ``best_model_path`` in ``on_train_end`` (to upload it, to evaluate it) finds it whole."""
    from pytorch_lightning import Callback

    _SlowWrites(monkeypatch)
    loaded = []

    class LoadBest(Callback):
        def on_train_end(self, trainer, pl_module):
            path = trainer.checkpoint_callback.best_model_path
            loaded.append((os.path.basename(path), torch.load(path)["global_step"]))

    _fit(tmp_path, [LoadBest()])
    assert loaded == [("epoch=0-step=20.ckpt", 20)]


def _ctrl_c_model(at_step: int, where: str) -> Any:
    """A model whose process gets a real SIGINT at ``at_step``: in its own ``on_train_batch_end``, after
    ``ModelCheckpoint`` decided that step's save (``"batch end"``), or as the next batch starts, while that save is
    being written (``"next batch"``)."""
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Model(BoringModel):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if where == "batch end" and self.trainer.global_step == at_step:
                os.kill(os.getpid(), signal.SIGINT)

        def on_train_batch_start(self, batch, batch_idx):
            if where == "next batch" and self.trainer.global_step == at_step:
                os.kill(os.getpid(), signal.SIGINT)

    return Model()


def _with_ctrl_c_handler(fit: Any) -> Any:
    # a runner started in the background has SIGINT ignored: this test sets the handler it needs
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return fit()
    finally:
        signal.signal(signal.SIGINT, previous)


@RunIf(xla=True)
@pytest.mark.parametrize("where", ["batch end", "next batch"])
def test_ctrl_c_returns_from_fit_with_its_checkpoints_written(tmp_path, monkeypatch, where):
    """A real SIGINT after step 10's save was decided: ``fit`` returns (as upstream's Ctrl-C does) with step 10's
    checkpoint on disk, the one ``best_model_path`` names, and ``trainer.test(ckpt_path="best")`` right after loads
    it."""
    slow = _SlowWrites(monkeypatch)
    trainer = _with_ctrl_c_handler(lambda: _fit(tmp_path, [], model=_ctrl_c_model(10, where)))
    assert trainer.interrupted and trainer.global_step == 10
    best = trainer.checkpoint_callback.best_model_path
    assert os.path.basename(best) == "epoch=0-step=10.ckpt"
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["epoch=0-step=10.ckpt"]
    assert slow.done == ["epoch=0-step=5.ckpt", "epoch=0-step=10.ckpt"]
    assert torch.load(best)["global_step"] == 10
    trainer.test(ckpt_path="best", dataloaders=DataLoader(torch.randn(4, 32), batch_size=2), verbose=False)


@RunIf(xla=True)
def test_ctrl_c_raises_a_checkpoint_write_that_failed(tmp_path, monkeypatch):
    """Ctrl-C ends ``fit`` quietly, but not a checkpoint that could not be written: its error is raised from ``fit``,
    with the path and the cause."""
    _SlowWrites(monkeypatch, fail="epoch=0-step=10.ckpt")
    with pytest.raises(RuntimeError, match="epoch=0-step=10.ckpt.*No space left on device") as failed:
        _with_ctrl_c_handler(lambda: _fit(tmp_path, [], model=_ctrl_c_model(10, "next batch")))
    assert isinstance(failed.value.__cause__, KeyboardInterrupt)


@RunIf(xla=True)
def test_ctrl_c_gives_sigterm_back(tmp_path, monkeypatch):
    """``fit`` ended by Ctrl-C gives SIGTERM back to its handler from before: the next ``fit`` handles a preemption."""
    # the default disposition, whatever an earlier test in this process left: `fit` watches SIGTERM only when free
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        trainer = _with_ctrl_c_handler(lambda: _fit(tmp_path, [], model=_ctrl_c_model(3, "batch end")))
        assert trainer.interrupted
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, previous)


@RunIf(xla=True)
def test_a_failed_last_write_is_raised_by_a_fit_inside_an_except_block(tmp_path, monkeypatch):
    """Whether ``fit`` is called inside an ``except`` block does not decide whether its failed write is raised."""
    _SlowWrites(monkeypatch, fail="epoch=0-step=20.ckpt")
    try:
        raise ValueError("the user's own error, handled")
    except ValueError:
        with pytest.raises(RuntimeError, match="epoch=0-step=20.ckpt.*No space left on device"):
            _fit(tmp_path, [])


@RunIf(xla=True)
# the CPU saves synchronously and was right before: it guards what XLA must equal
@pytest.mark.parametrize("accelerator", [pytest.param("cpu", marks=pytest.mark.guard), "tpu"])
def test_versioned_names_are_those_of_synchronous_saves(tmp_path, monkeypatch, accelerator):
    """``filename="{epoch}"`` with a save every 2 of 10 steps and every file kept: ``epoch=0.ckpt`` then ``-v1`` to
    ``-v4``, on XLA as on the CPU. A file still being written counts as existing when the next name is chosen."""
    _SlowWrites(monkeypatch, seconds=0.3)
    _fit(tmp_path, [], accelerator=accelerator, max_steps=10, filename="{epoch}", every_n_train_steps=2,
         save_top_k=-1, monitor=None)
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["epoch=0-v1.ckpt", "epoch=0-v2.ckpt", "epoch=0-v3.ckpt",
                                                      "epoch=0-v4.ckpt", "epoch=0.ckpt"]
    steps = [torch.load(tmp_path / "ckpts" / name)["global_step"] for name in
             ["epoch=0.ckpt", "epoch=0-v1.ckpt", "epoch=0-v2.ckpt", "epoch=0-v3.ckpt", "epoch=0-v4.ckpt"]]
    assert steps == [2, 4, 6, 8, 10]


@RunIf(xla=True)
def test_a_preemption_is_saved_after_a_failed_background_write(tmp_path, monkeypatch):
    """An earlier background write failed and SIGTERM comes before the next step raised it: the preemption checkpoint
    is written all the same, and the run exits with the preemption's status."""
    from pytorch_lightning import Callback
    from pytorch_lightning.trainer.connectors.xla_preemption import XLAPreempted

    _SlowWrites(monkeypatch, seconds=0.2, fail="epoch=0-step=5.ckpt")

    class Preempt(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 5:
                # before the next step would raise the failed write
                os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(XLAPreempted) as preempted:
        _fit(tmp_path, [Preempt()], save_last=True)
    assert preempted.value.status == 75
    saved = torch.load(tmp_path / "ckpts" / "last-preempted.ckpt")
    assert saved["global_step"] == 5
    assert not (tmp_path / "ckpts" / "epoch=0-step=5.ckpt").exists()
