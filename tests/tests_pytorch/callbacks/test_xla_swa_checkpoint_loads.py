"""A checkpoint of a ``StochasticWeightAveraging`` run loads under torch's safe unpickler and resumes, on XLA.

``SWALR`` keeps its annealing function in its state: pickled as ``getattr(SWALR, "_cosine_anneal")``, it made the
checkpoint one that ``torch.load(weights_only=True)`` refuses ("Unsupported global: GLOBAL getattr"), both in the
callback's state and in the checkpoint's ``lr_schedulers``. Covers
``0048-compat-checkpoints-load-with-torch-s-safe-unpickler.patch`` (a compat patch: no ``FIXED_BY``).
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf


def _model():
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model()


def _data():
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=generator)), batch_size=4)


def _trainer(tmp_path, max_epochs, *callbacks):
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import StochasticWeightAveraging

    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1, annealing_epochs=2)
    return Trainer(accelerator="tpu", devices=1, max_epochs=max_epochs, default_root_dir=tmp_path, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, callbacks=[swa, *callbacks]), swa


@RunIf(xla=True)
def test_an_swa_checkpoint_loads_with_the_safe_unpickler_and_resumes(tmp_path):
    from torch.optim.swa_utils import SWALR

    from pytorch_lightning.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)
    trainer, _ = _trainer(tmp_path, 2, checkpoint)
    trainer.fit(_model(), _data())
    last = checkpoint.last_model_path
    assert torch.serialization.get_unsafe_globals_in_checkpoint(last) == []
    saved = torch.load(last)  # torch's safe unpickler
    (swa_state,) = [v for k, v in saved["callbacks"].items() if k.startswith("StochasticWeightAveraging")]
    assert swa_state["n_averaged"] == 2 and swa_state["scheduler_state"]["last_epoch"] == 5
    assert "anneal_func" not in swa_state["scheduler_state"] and "anneal_func" not in saved["lr_schedulers"][0]

    resumed, swa = _trainer(tmp_path, 3)
    resumed.fit(_model(), _data(), ckpt_path=last)
    assert resumed.global_step == 6 and swa.n_averaged.item() == 3
    scheduler = resumed.lr_scheduler_configs[0].scheduler
    assert isinstance(scheduler, SWALR) and scheduler.anneal_func is SWALR._cosine_anneal
    # the saved state (5), restored, then stepped once at the end of the resumed epoch
    assert scheduler.last_epoch == 6
