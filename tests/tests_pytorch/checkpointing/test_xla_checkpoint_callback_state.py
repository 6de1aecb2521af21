"""A checkpoint written on XLA keeps the state of the callbacks, so a resumed run goes on where it stopped."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

pytest.importorskip("torch_xla")

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint  # noqa: E402
from pytorch_lightning.strategies import SingleTPUStrategy  # noqa: E402

FIXED_BY = "0017-xla-checkpoint-keeps-callback-state.patch"

# the validation loss of each epoch: best at epoch 1, worse after it
VAL_LOSSES = [0.5, 0.4, 0.6, 0.7, 0.8, 0.9]


class ScriptedValLoss(pl.LightningModule):
    """Trains a small layer; logs the validation loss of ``VAL_LOSSES`` for the current epoch, on the XLA device."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        loss = torch.tensor(VAL_LOSSES[self.current_epoch], device=self.device)
        self.log("val_loss", loss)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


def _fit(tmp_path, max_epochs: int, ckpt_path=None):
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path / "ckpts"), monitor="val_loss", save_top_k=2, save_last=True)
    early_stopping = EarlyStopping(monitor="val_loss", patience=3)
    trainer = pl.Trainer(
        accelerator="tpu",
        devices=1,
        max_epochs=max_epochs,
        callbacks=[checkpoint, early_stopping],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(ScriptedValLoss(), _loader(), _loader(), ckpt_path=ckpt_path)
    return trainer, checkpoint, early_stopping


@RunIf(xla=True)
def test_resume_on_xla_keeps_model_checkpoint_and_early_stopping_state(tmp_path):
    trainer, checkpoint, early_stopping = _fit(tmp_path, max_epochs=4)
    assert isinstance(trainer.strategy, SingleTPUStrategy)
    last = tmp_path / "ckpts" / "last.ckpt"
    saved = torch.load(last, map_location="cpu", weights_only=False)
    assert "callbacks" in saved
    assert float(checkpoint.best_model_score) == pytest.approx(0.4)
    assert early_stopping.wait_count == 2

    # the same number of epochs: nothing trains, the restored state is what the checkpoint held
    _, restored_checkpoint, restored_early_stopping = _fit(tmp_path, max_epochs=4, ckpt_path=str(last))
    assert float(restored_checkpoint.best_model_score) == pytest.approx(0.4)
    assert restored_checkpoint.best_model_path == checkpoint.best_model_path
    assert sorted(restored_checkpoint.best_k_models) == sorted(checkpoint.best_k_models)
    assert float(restored_checkpoint.kth_value) == pytest.approx(0.5)
    assert float(restored_early_stopping.best_score) == pytest.approx(0.4)
    assert restored_early_stopping.wait_count == 2

    # two more epochs allowed: the third epoch without improvement (epoch 4) ends the run, as it would have
    # without the interruption
    trainer, resumed_checkpoint, resumed_early_stopping = _fit(tmp_path, max_epochs=6, ckpt_path=str(last))
    assert resumed_early_stopping.stopped_epoch == 4
    assert trainer.current_epoch == 5
    assert float(resumed_checkpoint.best_model_score) == pytest.approx(0.4)
    assert sorted(resumed_checkpoint.best_k_models) == sorted(checkpoint.best_k_models)


@RunIf(xla=True)
def test_xla_checkpoint_resumes_on_a_machine_without_torch_xla(tmp_path):
    """The checkpoint written on XLA holds CPU tensors only: a CPU Trainer where ``import torch_xla`` is blocked
    resumes from it, callback states included."""
    _fit(tmp_path, max_epochs=4)
    last = str(tmp_path / "ckpts" / "last.ckpt")
    out = run_python(
        f"""
        import sys
        sys.modules["torch_xla"] = None  # a machine without torch_xla: `import torch_xla` raises
        import warnings
        warnings.simplefilter("ignore")
        import torch
        from torch.utils.data import DataLoader, TensorDataset
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

        class Module(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(4, 2)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        checkpoint = ModelCheckpoint(dirpath={str(tmp_path / "ckpts")!r}, monitor="val_loss", save_top_k=2,
                                     save_last=True)
        early_stopping = EarlyStopping(monitor="val_loss", patience=3)
        trainer = pl.Trainer(accelerator="cpu", max_epochs=4, callbacks=[checkpoint, early_stopping], logger=False,
                             enable_progress_bar=False, enable_model_summary=False)
        loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
        trainer.fit(Module(), loader, ckpt_path={last!r})
        emit({{"best": float(checkpoint.best_model_score), "wait": early_stopping.wait_count,
               "top_k": len(checkpoint.best_k_models), "torch_xla blocked": sys.modules["torch_xla"] is None}})
        """
    )
    assert out["best"] == pytest.approx(0.4)
    assert out == {"best": out["best"], "wait": 2, "top_k": 2, "torch_xla blocked": True}
