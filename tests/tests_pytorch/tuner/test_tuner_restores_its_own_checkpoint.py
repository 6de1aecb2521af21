"""The batch-size and learning-rate finders restore the checkpoint they wrote, whatever the hyperparameters hold.

Both tuners save the run before they start and restore it when they are done. Under torch's safe unpickler (the
default since torch 2.6, kept by the fork) that restore refused a checkpoint whose hyperparameters hold a type outside
the allowed ones, such as a loss module or a ``py.path.local``: the tuner crashed on its own file, written moments
before by the same process. Covers ``0048-compat-checkpoints-load-with-torch-s-safe-unpickler.patch`` (a compat
patch: no ``FIXED_BY``).
"""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import xla_device_reason

ON_XLA = [pytest.mark.xla, pytest.mark.skipif(xla_device_reason() is not None, reason=str(xla_device_reason()))]
ACCELERATORS = ["cpu", pytest.param("tpu", marks=ON_XLA)]


def _model(loss_fn):
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self, loss_fn, batch_size=2, lr=0.01):
            super().__init__()
            self.save_hyperparameters()
            self.batch_size = batch_size
            self.lr = lr
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.hparams.loss_fn(self.layer(x), y)

        def train_dataloader(self):
            generator = torch.Generator().manual_seed(0)
            data = TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator))
            return DataLoader(data, batch_size=self.batch_size)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    return Model(loss_fn)


def _trainer(accelerator, root):
    from pytorch_lightning import Trainer

    return Trainer(accelerator=accelerator, devices=1, max_epochs=1, default_root_dir=root, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_the_batch_size_finder_restores_a_checkpoint_holding_a_loss_module(tmpdir, accelerator):
    model = _model(torch.nn.MSELoss())
    weights = model.layer.weight.detach().clone()
    size = _trainer(accelerator, tmpdir).tuner.scale_batch_size(model, max_trials=2, steps_per_trial=1)
    assert size == 8  # 2, then 4 and 8 fit: two trials
    # the tuner's run is undone: the weights are those of before it
    assert torch.equal(model.layer.weight.detach().cpu(), weights)
    assert not list(tmpdir.visit(".scale_batch_size_*.ckpt"))


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_the_lr_finder_restores_a_checkpoint_holding_a_py_path(tmpdir, accelerator):
    model = _model(torch.nn.MSELoss())
    model.hparams["data_dir"] = tmpdir  # a py.path.local, as upstream's tests pass it
    weights = model.layer.weight.detach().clone()
    finder = _trainer(accelerator, tmpdir).tuner.lr_find(model, num_training=5, early_stop_threshold=None)
    assert len(finder.results["lr"]) == 5
    assert torch.equal(model.layer.weight.detach().cpu(), weights)
    assert not list(tmpdir.visit(".lr_find_*.ckpt"))


def test_a_checkpoint_the_user_gives_still_loads_safely(tmpdir):
    """Only the tuner's own file is read with the full unpickler: ``fit(ckpt_path=...)`` still refuses the type."""
    import pickle

    model = _model(torch.nn.MSELoss())
    trainer = _trainer("cpu", tmpdir)
    trainer.fit(model)
    path = str(tmpdir / "user.ckpt")
    trainer.save_checkpoint(path)
    with pytest.raises(pickle.UnpicklingError, match="MSELoss"):
        _trainer("cpu", tmpdir).fit(_model(torch.nn.MSELoss()), ckpt_path=path)
