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
