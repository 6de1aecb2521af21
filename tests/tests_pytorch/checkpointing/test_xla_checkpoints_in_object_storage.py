"""Whole checkpoints (``.ckpt`` files) in object storage: ``gs://`` URLs through ``gcsfs`` against a real GCS emulator
(``helpers/gcs_emulator.py``), on one XLA device and with ``TPUSpawnStrategy``'s per-host final weights.

These held before the fork touched object storage and must keep holding: ``ModelCheckpoint`` saves and prunes its
top-k there, ``load_from_checkpoint`` and ``fit(ckpt_path=...)`` read from there, and nothing is ever written to a
local directory named after the URL. The sharded SPMD checkpoints in object storage are tested with the SPMD strategy
(``strategies/test_xla_spmd_checkpoints_in_object_storage.py``).
"""
import os

import pytest
import torch

from helpers.gcs_emulator import gcs_objects
from helpers.multiprocess_scenarios import max_diff, run_scenario
from helpers.runif import RunIf

pytest.importorskip("torch_xla")

from pytorch_lightning import LightningModule, Trainer  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402

STEPS_PER_EPOCH = 3


class Scored(LightningModule):
    """A score that grows with the epoch, so that the top-k is known in advance: the latest epochs."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("score", float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(12, 4)), batch_size=4)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 4)), batch_size=4)


def _fit(root: str, epochs: int, ckpt_path=None):
    model = Scored()
    checkpoint = ModelCheckpoint(dirpath=f"{root}/checkpoints", monitor="score", mode="max", save_top_k=2,
                                 save_last=True)
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=epochs, default_root_dir=root, logger=False,
                      callbacks=[checkpoint], enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, ckpt_path=ckpt_path)
    return model, trainer, checkpoint


@RunIf(xla=True)
def test_full_checkpoints_in_gcs_on_one_xla_device(gcs_bucket, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = f"{gcs_bucket}/run"
    model, trainer, checkpoint = _fit(root, epochs=3)
    # top-2 of three epochs: the first was written, then removed from the bucket
    assert gcs_objects(root) == ["checkpoints/epoch=1-step=6.ckpt", "checkpoints/epoch=2-step=9.ckpt",
                                 "checkpoints/last.ckpt"]
    assert checkpoint.best_model_path == f"{root}/checkpoints/epoch=2-step=9.ckpt"
    trained = {k: v.cpu() for k, v in model.state_dict().items()}
    loaded = Scored.load_from_checkpoint(checkpoint.best_model_path, map_location="cpu")
    assert all(torch.equal(loaded.state_dict()[k], trained[k]) for k in trained)

    # resumed from the bucket's last.ckpt: the callback state came back, the fourth epoch continues the third
    resumed, trainer, checkpoint = _fit(root, epochs=4, ckpt_path=f"{root}/checkpoints/last.ckpt")
    assert trainer.global_step == 4 * STEPS_PER_EPOCH
    assert sorted(checkpoint.best_k_models) == [f"{root}/checkpoints/epoch=2-step=9.ckpt",
                                                f"{root}/checkpoints/epoch=3-step=12.ckpt"]
    assert gcs_objects(root) == ["checkpoints/epoch=2-step=9.ckpt", "checkpoints/epoch=3-step=12.ckpt",
                                 "checkpoints/last.ckpt"]
    # the bucket's last.ckpt holds the end of the resumed run
    last = torch.load(_read(f"{root}/checkpoints/last.ckpt"), map_location="cpu", weights_only=False)
    assert (last["epoch"], last["global_step"]) == (3, 12)
    assert os.listdir(tmp_path) == []  # nothing local, in particular no directory named "gs:"


def _read(url: str):
    import io

    import fsspec

    with fsspec.open(url, "rb") as f:
        return io.BytesIO(f.read())


@RunIf(xla=True)
@pytest.mark.slow
def test_tpu_spawn_final_weights_go_through_gcs(gcs_bucket, gcs_env, tmp_path, fork_server):
    """``TPUSpawnStrategy`` on a simulated host of two processes, ``default_root_dir`` in the bucket: the main process
    gets the trained weights back through ``.temp-host0.ckpt`` in the bucket, which it then deletes; nothing local."""
    root = f"{gcs_bucket}/run"
    result = run_scenario("final_weights_in_object_storage", str(tmp_path),
                          env={**gcs_env, "SCENARIO_ROOT_URL": root}, fork_server=fork_server)
    assert max_diff(result["xla"], result["cpu"]) < 1e-5
    assert result["left_in_storage"] == []
    assert result["local"] == ["records"]  # the harness's own records, no "gs:" directory
