"""On XLA, a ``trainer.save_checkpoint`` of the user's from any hook of ``fit`` resumes exactly, or says once at the
resume why it does not, naming the hook.

Each row is a run whose own callback saves ``own.ckpt`` in one hook, then a real ``SIGKILL`` a few steps later and
``fit(ckpt_path=own.ckpt)``, compared with the uninterrupted run (which writes no such file). The module and a
callback keep state in their own ``on_train_batch_end`` and ``on_train_epoch_end`` (``stateful``): a save in one of
those hooks misses what they do after it.
"""
import json
from pathlib import Path
from typing import Any, Dict

import pytest

from helpers.runif import RunIf

from helpers.exact_resume import check_exact, kill_and_resume, SINGLE_ENV

FIXED_BY = "0084-feature-xla-user-saves-at-an-epochs-start-or-in-a-validation.patch"

# hook -> (the global step the save waits for, the kill's step, None if the resume is exact, else what the warning
# names)
HOOKS = {
    "on_train_epoch_start": (1, 17, None),
    "on_train_batch_start": (4, 9, "while a batch was being trained"),
    "on_train_batch_end": (4, 9, "and then StatefulCallback, the LightningModule ran that hook too"),
    "on_train_epoch_end": (1, 17, "and then StatefulCallback ran that hook too"),
    "on_validation_start": (4, 9, None),
    "on_validation_batch_end": (4, 9, None),
    "on_validation_end": (4, 9, None),
}
# the rows that resumed as they do now before the patch (exact, or the warning of a save inside a batch): guards
GUARDS = ("on_train_batch_start", "on_validation_start", "on_validation_batch_end", "on_validation_end")


@RunIf(xla=True)
@pytest.mark.slow
def test_a_save_inside_a_validation_after_a_stateful_callback_says_why(tmp_path, computed_once, fork_server):
    """``EarlyStopping`` counts in its ``on_validation_end``, before the user's save in the same hook: the resumed run
    makes that validation again, and ``EarlyStopping`` counts it twice."""
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, 9, "own.ckpt", num_workers=0,
                           background_writes=False, stateful=True, early_stopping=True,
                            user_save={"hook": "on_validation_end", "step": 4})
    said = [line for line in runs["output"].splitlines() if "approximate" in line]
    assert len(said) == 1
    assert "inside `on_validation_end`, where EarlyStopping had run hooks before the call" in said[0]
    assert "the resumed run runs that validation again" in said[0]


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("hook", [pytest.param(h, marks=pytest.mark.guard) if h in GUARDS else h for h in HOOKS])
def test_a_save_from_any_hook_resumes_exactly_or_says_why(tmp_path, computed_once, fork_server, hook):
    step, kill_at, names = HOOKS[hook]
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, kill_at, "own.ckpt", num_workers=0,
                           background_writes=False, stateful=True, user_save={"hook": hook, "step": step})
    said = [line for line in runs["output"].splitlines() if "approximate" in line]
    if names is None:
        assert said == []
        check_exact(runs)
    else:
        assert len(said) == 1 and names in said[0] and f"`{hook}`" in said[0]


def _fit_module_that_saves_in_its_validation_end(tmp_path: Path, counts_before_the_save: bool,
                                                 ckpt_path: Any = None) -> Any:
    """One XLA device in this process, 32 steps with a validation after steps 16 and 32. The LightningModule counts
    its validations in a buffer, in ``on_validation_epoch_end`` (before its own save) or in ``on_validation_end``
    after the save, and saves ``own.ckpt`` in its ``on_validation_end`` of step 16."""
    import torch
    from torch.utils.data import DataLoader

    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    path = tmp_path / "own.ckpt"

    class Model(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("validations", torch.zeros(()))

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=2)

        def val_dataloader(self):
            return DataLoader(RandomDataset(32, 4), batch_size=2)

        def on_validation_end(self) -> None:
            if self.trainer.global_step == 16 and not path.exists():
                self.trainer.save_checkpoint(path)
            if not counts_before_the_save:
                self.validations += 1

    class CountsBeforeTheSave(Model):
        def on_validation_epoch_end(self) -> None:
            self.validations += 1

    model = CountsBeforeTheSave() if counts_before_the_save else Model()
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, val_check_interval=0.5, num_sanity_val_steps=0,
                      logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(model, ckpt_path=ckpt_path)
    assert trainer.global_step == 32
    return int(model.validations.cpu())


@RunIf(xla=True)
# counted after the save: exact, and silent, before the patch too (a guard)
@pytest.mark.parametrize("counts_before_the_save", [True, pytest.param(False, marks=pytest.mark.guard)],
                         ids=["counted before", "counted after"])
def test_a_save_in_the_modules_own_validation_hook_says_when_its_earlier_hooks_run_twice(
    tmp_path, counts_before_the_save
):
    """The LightningModule saves in its own ``on_validation_end``. When it changed its state in an earlier hook of
    that validation (``on_validation_epoch_end``), the resumed run makes the validation again and counts it twice, and
    the resume says so; when it changes it after the save, the resume is exact and says nothing."""
    import warnings

    assert _fit_module_that_saves_in_its_validation_end(tmp_path, counts_before_the_save) == 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = _fit_module_that_saves_in_its_validation_end(
            tmp_path / "resumed", counts_before_the_save, ckpt_path=str(tmp_path / "own.ckpt")
        )
    said = [str(w.message) for w in caught if "approximate" in str(w.message)]
    if counts_before_the_save:
        # the validation of step 16 counted twice: what the warning says
        assert resumed == 3
        assert len(said) == 1
        assert "inside `on_validation_end`, where the LightningModule had run hooks before the call" in said[0]
    else:
        assert resumed == 2
        assert said == []
