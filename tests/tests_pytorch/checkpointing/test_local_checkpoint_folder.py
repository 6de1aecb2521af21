"""A local checkpoint folder is normalised to a ``str`` as 1.8.6 does it, with today's fsspec too.

1.8.6 runs ``os.path.realpath`` on a local ``ModelCheckpoint(dirpath=...)`` (and ``normpath`` on
``trainer.default_root_dir``) only when fsspec names the filesystem's protocol ``"file"``; today's fsspec names it
``("file", "local")``. Without the normalisation the callback kept the caller's object: a ``py.path.local`` (pytest's
``tmpdir``) went into every checkpoint's callback state, which torch's safe unpickler then refused to load.
Covers ``0062-compat-local-paths-with-today-s-fsspec.patch`` (a compat patch: no ``FIXED_BY``).
"""
import os

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import xla_device_reason

ON_XLA = [pytest.mark.xla, pytest.mark.skipif(xla_device_reason() is not None, reason=str(xla_device_reason()))]
ACCELERATORS = ["cpu", pytest.param("tpu", marks=ON_XLA)]


def _model_class():
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model


def _data():
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=generator)), batch_size=4)


def _trainer(accelerator, root, max_epochs, checkpoint):
    from pytorch_lightning import Trainer

    return Trainer(accelerator=accelerator, devices=1, max_epochs=max_epochs, default_root_dir=root, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoint])


@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_a_py_path_checkpoint_folder_is_saved_as_a_str_and_loads(tmpdir, accelerator):
    """``tmpdir`` is a ``py.path.local``, as in upstream's own tests."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    folder = tmpdir / "sub" / ".." / "ckpts"
    checkpoint = ModelCheckpoint(dirpath=folder, save_last=True)
    assert type(checkpoint.dirpath) is str and checkpoint.dirpath == os.path.realpath(str(folder))
    _trainer(accelerator, tmpdir, 1, checkpoint).fit(_model_class()(), _data())

    last = os.path.join(os.path.realpath(str(folder)), "last.ckpt")
    assert checkpoint.last_model_path == last
    (state,) = [v for k, v in torch.load(last, weights_only=False)["callbacks"].items() if k.startswith("ModelCheck")]
    assert type(state["dirpath"]) is str and state["dirpath"] == os.path.realpath(str(folder))
    # torch's safe unpickler: what `load_from_checkpoint` and `fit(ckpt_path=...)` use
    assert torch.serialization.get_unsafe_globals_in_checkpoint(last) == []

    loaded = _model_class().load_from_checkpoint(last)
    assert torch.equal(loaded.layer.weight, torch.load(last)["state_dict"]["layer.weight"])
    resumed = _trainer(accelerator, tmpdir, 2, ModelCheckpoint(dirpath=tmpdir / "ckpts"))
    resumed.fit(_model_class()(), _data(), ckpt_path=last)
    assert resumed.global_step == 4 and resumed.current_epoch == 2


def test_a_relative_checkpoint_folder_becomes_its_real_path(tmp_path, monkeypatch):
    from pytorch_lightning.callbacks import ModelCheckpoint

    monkeypatch.chdir(tmp_path)
    assert ModelCheckpoint(dirpath="ckpts/").dirpath == os.path.join(os.path.realpath(tmp_path), "ckpts")
    # a URL is left as it is
    assert ModelCheckpoint(dirpath="memory://bucket/ckpts").dirpath == "memory://bucket/ckpts"


def test_a_local_default_root_dir_is_normalised(tmp_path):
    from pytorch_lightning import Trainer

    trainer = Trainer(accelerator="cpu", default_root_dir=f"{tmp_path}/a/../b/", logger=False)
    assert trainer.default_root_dir == os.path.join(str(tmp_path), "b")
    trainer = Trainer(accelerator="cpu", default_root_dir="memory://bucket/a/../b/", logger=False)
    assert trainer.default_root_dir == "memory://bucket/a/../b/"
