"""The Trainer's state enums compare their own members by identity, and everything else as before."""
import pickle
import warnings

import pytest
from lightning_utilities.core.enums import StrEnum

from pytorch_lightning.trainer.states import RunningStage, TrainerFn, TrainerState, TrainerStatus

from helpers.python_calls import calls_of

FIXED_BY = "0033-trainer-state-enums-compare-members-by-identity.patch"


def _str_enum_eq_calls(fn) -> int:
    return calls_of(StrEnum.__eq__.__code__, fn)


@pytest.mark.parametrize("stage", [RunningStage.TRAINING, RunningStage.VALIDATING])
def test_stage_checks_do_not_compare_strings(stage):
    state = TrainerState(fn=TrainerFn.FITTING, stage=stage)
    training = RunningStage.TRAINING

    def checks():
        for _ in range(10):
            assert (state.stage == training) is (stage is training)
            assert state.fn == TrainerFn.FITTING
            assert state.status == TrainerStatus.INITIALIZING

    assert _str_enum_eq_calls(checks) == 0


@pytest.mark.guard  # unchanged behaviour, right before the fix too
def test_comparisons_and_hashes_are_unchanged():
    assert RunningStage.TRAINING == "train" and "train" == RunningStage.TRAINING
    assert RunningStage.TRAINING == "TRAIN"  # LightningEnum compares strings case-insensitively
    assert RunningStage.TRAINING != RunningStage.VALIDATING and RunningStage.TRAINING != "validate"
    assert RunningStage.TRAINING != None  # noqa: E711
    assert TrainerFn.FITTING == "fit" and TrainerStatus.FINISHED == "finished"
    assert {RunningStage.TRAINING: 1}["train"] == 1 and hash(TrainerFn.FITTING) == hash("fit")
    assert pickle.loads(pickle.dumps(RunningStage.TRAINING)) is RunningStage.TRAINING
    assert TrainerStatus.INTERRUPTED.stopped and not TrainerStatus.RUNNING.stopped
    assert RunningStage.TUNING not in RunningStage._without_tune()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RunningStage.TUNING
    assert any("RunningStage.TUNING" in str(w.message) for w in caught)
