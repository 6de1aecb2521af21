"""``fit(ckpt_path="last")`` finds the last checkpoint when ``ModelCheckpoint`` writes to an fsspec URL.

A remote filesystem lists its objects without the protocol (``bucket/run/last.ckpt``), and 1.8.6 took those names for
local paths: nothing was found, and the run started over with "No checkpoint will be loaded". The same lookup compared
checkpoints by modification time, which an object store does not keep for a folder, such as a sharded checkpoint.
Against a real GCS emulator (``helpers/gcs_emulator.py``), on the CPU: nothing here is XLA's.
"""
import pytest
import torch

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringModel

FIXED_BY = "0058-last-checkpoint-in-an-fsspec-url-folder.patch"


class CountBatches(pl.Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, *args) -> None:
        self.batches += 1


def _fit(dirpath: str, tmp_path, epochs: int, ckpt_path=None) -> CountBatches:
    counter = CountBatches()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        limit_train_batches=4,
        limit_val_batches=0,
        callbacks=[ModelCheckpoint(dirpath=dirpath, save_last=True), counter],
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    assert trainer.global_step == 4 * epochs
    return counter


def test_resume_from_the_last_checkpoint_in_a_bucket(tmp_path, gcs_bucket):
    _fit(f"{gcs_bucket}/run", tmp_path, epochs=1)
    resumed = _fit(f"{gcs_bucket}/run", tmp_path, epochs=2, ckpt_path="last")
    # the second epoch only: the first came from `last.ckpt` in the bucket
    assert resumed.batches == 4


def test_a_folder_checkpoint_in_a_bucket_is_dated_by_its_files(tmp_path, gcs_bucket):
    """A checkpoint that is a folder (as sharded ones are) next to ``last.ckpt``: the newer of the two is taken."""
    import gcsfs

    _fit(f"{gcs_bucket}/run", tmp_path, epochs=1)
    fs = gcsfs.GCSFileSystem(token="anon")
    root = gcs_bucket[len("gs://"):]
    # written after `last.ckpt`: a folder holding a checkpoint file (the lookup dates it by its newest file)
    with fs.open(f"{root}/run/last-folder.ckpt/00000001/checkpoint.pt", "wb") as f:
        torch.save(torch.load(fs.open(f"{root}/run/last.ckpt", "rb"), weights_only=False), f)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        callbacks=[ModelCheckpoint(dirpath=f"{gcs_bucket}/run", save_last=True)],
        default_root_dir=tmp_path,
        logger=False,
    )
    found = trainer._checkpoint_connector._set_ckpt_path(
        trainer.state.fn or pl.trainer.states.TrainerFn.FITTING, "last", model_provided=True, model_connected=True
    )
    assert found == f"{gcs_bucket}/run/last-folder.ckpt"


@pytest.mark.guard
def test_resume_from_the_last_checkpoint_on_local_disk(tmp_path):
    _fit(str(tmp_path / "run"), tmp_path, epochs=1)
    assert _fit(str(tmp_path / "run"), tmp_path, epochs=2, ckpt_path="last").batches == 4
