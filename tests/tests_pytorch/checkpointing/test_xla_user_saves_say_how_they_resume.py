"""A checkpoint a user writes with ``trainer.save_checkpoint`` inside a hook of ``fit`` on XLA resumes exactly, or the
resume says once why it will not.

``ModelCheckpoint`` writes between batches (every hook of the batch has run). A user's own save inside a hook is
written where it is called: whatever runs after the call in that hook's turn (another callback's hook, the
LightningModule's) changed state that is not in the checkpoint, and the resumed run does not run that hook again;
inside ``training_step`` the batch is half trained; between two batches of an accumulation, the accumulated gradients
are not in a checkpoint. Each of these now says so when ``fit(ckpt_path=...)`` starts, naming the cause; a save whose
hook nothing else overrides resumes without a word.
"""
import warnings
from pathlib import Path
from typing import Any, List, Optional

import pytest
from torch.utils.data import DataLoader

from helpers.runif import RunIf

FIXED_BY = "0082-feature-xla-user-saves-say-how-they-resume.patch"


def _fit(tmp_path: Path, callbacks: List[Any], model_hooks: Optional[dict] = None, ckpt_path: Optional[str] = None,
         accumulate: int = 1, max_epochs: int = 1) -> List[str]:
    """One XLA device, 16 batches an epoch; returns the messages of the warnings about an approximate resume."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Model(BoringModel):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 32), batch_size=2, shuffle=True)

    for name, hook in (model_hooks or {}).items():
        setattr(Model, name, hook)
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=max_epochs, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      enable_checkpointing=False, accumulate_grad_batches=accumulate, callbacks=callbacks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Model(), ckpt_path=ckpt_path)
    return [str(w.message) for w in caught if "approximate" in str(w.message)]


class _SaveAt:
    """Saves ``own.ckpt`` in ``hook`` at the batch of index ``batch`` (or at the first epoch's end)."""

    def __new__(cls, hook: str, path: Path, batch: int = 5) -> Any:
        from pytorch_lightning import Callback

        def save(self, trainer, pl_module, *args):
            if hook == "on_train_epoch_end" or args[-1] == batch:
                if not path.exists():
                    trainer.save_checkpoint(path)

        return type("SaveAt", (Callback,), {hook: save})()


# silent before, and must stay silent
@RunIf(xla=True)
@pytest.mark.guard
def test_a_save_alone_in_its_hook_resumes_without_a_word(tmp_path):
    path = tmp_path / "own.ckpt"
    assert _fit(tmp_path, [_SaveAt("on_train_batch_end", path)]) == []
    assert _fit(tmp_path, [], ckpt_path=str(path)) == []


@RunIf(xla=True)
def test_a_save_before_the_modules_own_batch_end_names_it(tmp_path):
    path = tmp_path / "own.ckpt"

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.ema = getattr(self, "ema", 0) + 1

    hooks = {"on_train_batch_end": on_train_batch_end}
    _fit(tmp_path, [_SaveAt("on_train_batch_end", path)], model_hooks=hooks)
    said = _fit(tmp_path, [], model_hooks=hooks, ckpt_path=str(path))
    assert said == [
        f"The checkpoint {path} resumes approximately: it was written by `trainer.save_checkpoint` inside"
        " `on_train_batch_end`, and then the LightningModule ran that hook too: what they did is not in the checkpoint,"
        " and the resumed run does not run that hook again. Checkpoints that `ModelCheckpoint` writes on XLA resume"
        " exactly."
    ]


@RunIf(xla=True)
def test_a_save_at_the_epochs_end_with_another_hook_names_it(tmp_path):
    from pytorch_lightning import Callback

    class Counts(Callback):
        """Keeps a count in its ``on_train_epoch_end``, and saves it."""

        def __init__(self):
            self.ends = 0

        def on_train_epoch_end(self, trainer, pl_module):
            self.ends += 1

        def state_dict(self):
            return {"ends": self.ends}

    class Quiet(Callback):
        """Runs in ``on_train_epoch_end`` too, but saves nothing: a resumed run starts it afresh anyway."""

        def on_train_epoch_end(self, trainer, pl_module):
            pass

    path = tmp_path / "own.ckpt"
    _fit(tmp_path, [_SaveAt("on_train_epoch_end", path), Quiet(), Counts()])
    said = _fit(tmp_path, [Quiet(), Counts()], ckpt_path=str(path), max_epochs=2)
    assert len(said) == 1 and "inside `on_train_epoch_end`, and then Counts ran that hook too" in said[0]


@RunIf(xla=True)
def test_a_save_inside_an_accumulation_names_it(tmp_path):
    path = tmp_path / "own.ckpt"
    # batch index 4 is the first of an accumulation of 2: its gradients wait for batch 5
    _fit(tmp_path, [_SaveAt("on_train_batch_end", path, batch=4)], accumulate=2)
    said = _fit(tmp_path, [], ckpt_path=str(path), accumulate=2)
    assert len(said) == 1
    assert "inside `on_train_batch_end` between two batches of an accumulation: the gradients accumulated" in said[0]


@RunIf(xla=True)
def test_a_save_inside_training_step_names_it(tmp_path):
    path = tmp_path / "own.ckpt"

    def training_step(self, batch, batch_idx):
        if batch_idx == 5 and not path.exists():
            self.trainer.save_checkpoint(path)
        return {"loss": self.step(batch)}

    hooks = {"training_step": training_step}
    _fit(tmp_path, [], model_hooks=hooks)
    said = _fit(tmp_path, [], model_hooks=hooks, ckpt_path=str(path))
    assert len(said) == 1
    assert said[0].startswith("You're resuming from a checkpoint that ended before the epoch ended.")
    assert f"The checkpoint {path} (it was written inside `training_step`, while a batch was being trained)" in said[0]
