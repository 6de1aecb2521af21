"""On XLA, a checkpoint written in the background holds the state of the moment it was saved, every object of it.

``ModelCheckpoint``'s saves copy the state on the training thread and serialise it on a writer thread while training
goes on. The tensors were always copied; what a callback's ``state_dict()`` or a module's ``on_save_checkpoint``
returns may also hold objects that training changes in place: a NumPy array, a set, a ``deque``, an object of the
user's. Those must be copied at the save too, or the file holds whatever they were when the writer got to them.

Each write here is held for a moment on the writer thread, so that training has gone on by the time it serialises:
the outcome does not depend on how fast this host writes.
"""
import collections
import time
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from helpers.runif import RunIf

FIXED_BY = "0083-feature-xla-background-saves-copy-every-object.patch"


class Tracker:
    """An object of the user's, with a list inside: the deepest kind of state a callback keeps."""

    def __init__(self) -> None:
        self.steps: List[int] = []
        self.last: Dict[str, Any] = {"step": 0, "seen": set()}


def _hold_writes(monkeypatch: Any, seconds: float = 0.5) -> None:
    from lightning_lite.plugins.io import xla

    real = xla._serialise_and_write

    def held(checkpoint: Dict[str, Any], path: Any) -> None:
        time.sleep(seconds)
        real(checkpoint, path)

    monkeypatch.setattr(xla, "_serialise_and_write", held)


def _fit(tmp_path: Path, accelerator: str) -> None:
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Counting(Callback):
        """Counts in place at every batch, and saves what it counts."""

        def __init__(self) -> None:
            self.counts = np.zeros(4, dtype=np.int64)
            self.seen: set = set()
            self.recent: collections.deque = collections.deque(maxlen=3)
            self.tracker = Tracker()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            step = trainer.global_step
            self.counts[step % 4] += 1
            self.seen.add(step)
            self.recent.append(step)
            self.tracker.steps.append(step)
            self.tracker.last["step"] = step
            self.tracker.last["seen"].add(step)

        def state_dict(self) -> Dict[str, Any]:
            return {"counts": self.counts, "seen": self.seen, "recent": self.recent, "tracker": self.tracker}

    class Model(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.history = np.zeros(3)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.history += 1

        def on_save_checkpoint(self, checkpoint):
            checkpoint["history"] = self.history

    trainer = Trainer(accelerator=accelerator, devices=1, max_steps=20, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[Counting(), ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=5,
                                                             save_top_k=-1)])
    trainer.fit(Model())


@RunIf(xla=True)
# the CPU writes synchronously: the reference, which passed before too
@pytest.mark.parametrize("accelerator", ["tpu", pytest.param("cpu", marks=pytest.mark.guard)])
def test_a_background_save_holds_the_objects_as_they_were_at_the_save(tmp_path, monkeypatch, accelerator):
    """Step 5's, 10's, 15's and 20's checkpoints each hold the callback's and the module's objects as they were after
    that step, though training changed them in place while the writes were held. The CPU (synchronous writes) is the
    reference."""
    _hold_writes(monkeypatch)
    _fit(tmp_path, accelerator)
    for step in (5, 10, 15, 20):
        # objects of the user's: the user's own trust, as in any `torch.load` of them
        checkpoint = torch.load(tmp_path / "ckpts" / f"epoch=0-step={step}.ckpt", weights_only=False)
        (state,) = [v for k, v in checkpoint["callbacks"].items() if "Counting" in k]
        steps = list(range(1, step + 1))
        assert state["counts"].tolist() == [sum(1 for s in steps if s % 4 == i) for i in range(4)]
        assert state["seen"] == set(steps)
        assert list(state["recent"]) == steps[-3:]
        assert state["tracker"].steps == steps
        assert state["tracker"].last == {"step": step, "seen": set(steps)}
        # the module's own `on_train_batch_end` runs after the callbacks': on XLA the batch's save waits for it (the
        # checkpoint resumes after the whole batch), on the CPU it is saved before it
        assert checkpoint["history"].tolist() == [step if accelerator == "tpu" else step - 1] * 3


@RunIf(xla=True)
def test_objects_saved_twice_in_one_step_stay_one_object(tmp_path, monkeypatch):
    """A top-k file and ``last.ckpt`` of the same step share their copies; inside one checkpoint, two references to
    one object still load as one object (as ``torch.save`` keeps them)."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    shared = {"values": [1, 2]}

    class Model(BoringModel):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

        def on_save_checkpoint(self, checkpoint):
            checkpoint["a"], checkpoint["b"] = shared, shared
            checkpoint["tensor_twice"] = (self.layer.weight, self.layer.weight)

    _hold_writes(monkeypatch, 0.1)
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=4, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_last=True)])
    trainer.fit(Model())
    for name in ("epoch=0-step=4.ckpt", "last.ckpt"):
        checkpoint = torch.load(tmp_path / "ckpts" / name)
        assert checkpoint["a"] is checkpoint["b"]
        first, second = checkpoint["tensor_twice"]
        assert first.data_ptr() == second.data_ptr()
        assert torch.equal(first, checkpoint["state_dict"]["layer.weight"])


class _Stubborn:
    """Pickles, but refuses ``copy.deepcopy`` (as some handles and C extension types do)."""

    def __init__(self) -> None:
        self.steps: List[int] = []

    def __deepcopy__(self, memo: Dict[int, Any]) -> "_Stubborn":
        raise TypeError("cannot deepcopy a _Stubborn")


@RunIf(xla=True)
def test_an_object_that_cannot_be_copied_is_serialised_at_the_save_and_said(tmp_path, monkeypatch):
    """The save serialises on the training thread instead (the file is still written in the background) and warns once
    with what to do; each checkpoint still holds its own step's state."""
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Keeping(Callback):
        def __init__(self) -> None:
            self.kept = _Stubborn()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.kept.steps.append(trainer.global_step)

        def state_dict(self) -> Dict[str, Any]:
            return {"kept": self.kept}

    class Model(BoringModel):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

    _hold_writes(monkeypatch)
    from lightning_lite.plugins.io import xla

    monkeypatch.setattr(xla, "_atomic_write", _held(xla._atomic_write))
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=10, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[Keeping(), ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=5,
                                                            save_top_k=-1)])
    with pytest.warns(UserWarning, match=r"cannot copy \(TypeError\('cannot deepcopy a _Stubborn'\)\).*__deepcopy__") as w:
        trainer.fit(Model())
    assert sum("cannot copy" in str(m.message) for m in w) == 1
    for step in (5, 10):
        checkpoint = torch.load(tmp_path / "ckpts" / f"epoch=0-step={step}.ckpt", weights_only=False)
        (state,) = [v for k, v in checkpoint["callbacks"].items() if "Keeping" in k]
        assert state["kept"].steps == list(range(1, step + 1))


def _held(write: Any, seconds: float = 0.5) -> Any:
    def held(data: bytes, path: Any) -> None:
        time.sleep(seconds)
        write(data, path)

    return held


@RunIf(xla=True)
# a ModelCheckpoint save in the background shared its copies by XLA id before too: a guard
@pytest.mark.parametrize("background", [False, pytest.param(True, marks=pytest.mark.guard)],
                         ids=["save_checkpoint", "ModelCheckpoint"])
def test_a_tied_weight_is_saved_once_as_on_other_devices(tmp_path, background):
    """An output layer tied to the embedding (as in most language models): its state dict names one parameter twice.
    ``torch.save`` stores it once and loads it as one tensor; on XLA each name got its own copy, twice the bytes."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Tied(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Linear(32, 32, bias=False)
            self.head = torch.nn.Linear(32, 32, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, x):
            return self.layer(self.head(self.embed(x)))

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if not background and self.trainer.global_step == 4:
                # the user's save, written before it returns (after `fit`, the module is back on the CPU, where
                # moving it from XLA untied the weights)
                self.trainer.save_checkpoint(path)

    path = tmp_path / "ckpts" / "epoch=0-step=4.ckpt" if background else tmp_path / "saved.ckpt"
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=4, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=4)])
    trainer.fit(Tied())
    state = torch.load(path)["state_dict"]
    assert state["head.weight"].data_ptr() == state["embed.weight"].data_ptr()
    assert torch.equal(state["head.weight"], trainer.lightning_module.embed.weight.cpu())
