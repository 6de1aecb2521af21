"""A small classifier on one XLA device: ``ClassifierModule`` (records where batches and parameters live in each
stage), its data (``classifier_loader``) and a quiet ``Trainer`` (``xla_trainer``). A module of its own so that a
fresh interpreter or a spawned process can import them (``tests_pytorch/strategies/test_xla_pjrt.py``)."""
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ClassifierModule(pl.LightningModule):
    """A 16-32-4 MLP that records, inside its hooks, where batches and parameters live."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.seen = {}

    def forward(self, x):
        return self.net(x)

    def _record(self, stage: str, batch) -> None:
        devices = self.seen.setdefault(stage, set())
        devices.add(batch[0].device.type)
        devices.update(p.device.type for p in self.parameters())

    def training_step(self, batch, batch_idx):
        self._record("train", batch)
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        self._record("val", batch)
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        self._record("test", batch)
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        self._record("predict", batch)
        return self(batch[0]).argmax(-1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def classifier_loader(n: int = 64) -> DataLoader:
    """``n`` samples of 16 features, 4 classes from the signs of the first two, in batches of 16."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    return DataLoader(TensorDataset(x, y), batch_size=16)


def xla_trainer(tmp_path, **kwargs) -> pl.Trainer:
    """A quiet ``Trainer`` on one XLA device (``accelerator="tpu"``), without logger or checkpoints."""
    defaults = dict(
        accelerator="tpu",
        devices=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    defaults.update(kwargs)
    return pl.Trainer(**defaults)
