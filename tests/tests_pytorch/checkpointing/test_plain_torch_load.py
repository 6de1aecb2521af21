"""Checkpoints that hold random states load with plain ``torch.load`` under torch's default ``weights_only=True``.

NumPy's random state is kept with its key array as a tensor (``0069-compat-numpy-random-state-loads-with-torch-load``,
a compat patch: no ``FIXED_BY``): torch's safe unpickler refuses NumPy arrays, so a checkpoint holding
``np.random.get_state()`` failed ``torch.load(path)`` ("Unsupported global: GLOBAL
numpy._core.multiarray._reconstruct"). The random states of 1.8.6's own form still restore. A real preemption
checkpoint loads with plain ``torch.load``: ``tests_pytorch/trainer/connectors/test_xla_preemption.py::
test_a_preemption_checkpoint_loads_with_plain_torch_load``.
"""
import io
import random

import numpy as np
import pytest
import torch


def _draws():
    return np.random.rand(4).tolist(), random.random(), torch.rand(3).tolist()


def test_random_states_go_through_plain_torch_load_and_draw_the_same_numbers():
    from lightning_lite.utilities.seed import _collect_rng_states, _set_rng_states

    np.random.seed(3)
    random.seed(4)
    torch.manual_seed(5)
    np.random.rand(7)  # a key array that is not the seed's
    states = _collect_rng_states()
    expected = _draws()
    buffer = io.BytesIO()
    torch.save({"rng": states}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # torch 2.9's default: weights only
    assert isinstance(loaded["rng"]["numpy"][1], torch.Tensor)
    _set_rng_states(loaded["rng"])
    assert _draws() == expected


def test_a_random_state_of_lightning_1_8_6_s_form_still_restores():
    from lightning_lite.utilities.seed import _collect_rng_states, _set_rng_states

    np.random.seed(11)
    old = {**_collect_rng_states(), "numpy": np.random.get_state()}
    expected = np.random.rand(5).tolist()
    _set_rng_states(old)
    assert np.random.rand(5).tolist() == expected


def test_a_fault_tolerant_checkpoint_loads_with_plain_torch_load_and_resumes(tmp_path, monkeypatch):
    """The logged values in the loops' state of a fault-tolerant checkpoint are torchmetrics states, which hold
    functions (the log reductions, torchmetrics' ``jit_distributed_available``); they are written by name, so that
    ``torch.load(path)`` reads the file under torch's default, and given back when Lightning loads it."""
    import torchmetrics

    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    monkeypatch.setenv("PL_FAULT_TOLERANT_TRAINING", "1")

    class Model(BoringModel):
        def __init__(self, crash_at=None):
            super().__init__()
            self.mean = torchmetrics.MeanMetric()
            self.crash_at = crash_at

        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.mean(out["loss"])
            self.log("mean", self.mean)
            self.log("worst", out["loss"], reduce_fx="max")
            self.log("total", out["loss"], reduce_fx=sum)
            if self.global_step == self.crash_at:
                raise RuntimeError("the run crashed")
            return out

    def trainer():
        return Trainer(max_epochs=1, limit_train_batches=8, limit_val_batches=0, default_root_dir=tmp_path,
                       logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")

    with pytest.raises(RuntimeError, match="the run crashed"):
        trainer().fit(Model(crash_at=3))
    path = tmp_path / ".pl_auto_save.ckpt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)) == []
    loops = torch.load(path)["loops"]  # torch 2.9's default: weights only
    assert loops["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] == 3
    resumed = trainer()
    resumed.fit(Model(), ckpt_path=str(path))
    assert resumed.global_step == 8
    assert set(resumed.callback_metrics) == {"mean", "worst", "total"}
