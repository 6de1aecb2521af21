"""A model whose hyperparameters hold what a checkpoint must keep: an enum member (``Activation``), a class and an
``AttributeDict``; its data and a ``Trainer`` on one XLA device. Shared by the checkpoint tests of
``tests_pytorch/checkpointing`` (XLA saves, safe loading)."""
import enum

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.parsing import AttributeDict
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Activation(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


class Model(pl.LightningModule):
    """Its hyperparameters hold an enum member, a class and an ``AttributeDict``."""

    def __init__(self, activation=Activation.TANH, block=nn.Linear, extra=AttributeDict(depth=2)) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(block(4, 8), nn.Tanh() if activation is Activation.TANH else nn.ReLU(), block(8, 1))

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


def hparams_loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0))), batch_size=4)


def hparams_trainer(tmp_path, max_epochs: int = 1, **kwargs) -> pl.Trainer:
    """A ``Trainer`` on one XLA device (``accelerator="tpu"``), checkpointing, without a logger."""
    return pl.Trainer(accelerator="tpu", devices=1, max_epochs=max_epochs, default_root_dir=tmp_path, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)
