"""``Trainer.training`` and the other stage properties compare with `RunningStage` members read once.

Reading a member of ``RunningStage`` goes through its metaclass, which runs the member's deprecation check; the loops
ask for the stage many times a batch (``trainer.training`` alone about twenty), so each of those paid for the check.
"""
from unittest import mock

import pytest

FIXED_BY = "0041-trainer-stage-properties-read-members-once.patch"

PROPERTIES = ("training", "validating", "testing", "predicting", "sanity_checking")


def test_stage_properties_run_no_deprecation_check():
    from pytorch_lightning import Trainer
    from pytorch_lightning.trainer.states import RunningStage

    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.state.stage = RunningStage.TRAINING
    with mock.patch.object(RunningStage, "deprecate") as deprecate:
        for _ in range(10):
            for name in PROPERTIES:
                getattr(trainer, name)
    # before: one check per read of a property, 50 here
    assert deprecate.call_count == 0


@pytest.mark.guard
@pytest.mark.parametrize("stage", ["train", "validate", "test", "predict", "sanity_check", None])
def test_stage_properties_answer_as_before(stage):
    from pytorch_lightning import Trainer
    from pytorch_lightning.trainer.states import RunningStage

    trainer = Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    expected = dict.fromkeys(PROPERTIES, False)
    names = {"train": "training", "validate": "validating", "test": "testing", "predict": "predicting",
             "sanity_check": "sanity_checking"}
    if stage is not None:
        expected[names[stage]] = True
    # a member, and the plain string of its value (the enum is a `str` enum), give the same answers
    for value in ([RunningStage(stage), stage] if stage is not None else [None]):
        trainer.state.stage = value
        assert {name: getattr(trainer, name) for name in PROPERTIES} == expected, value
    # and the setters still set the members
    trainer.training = True
    assert trainer.state.stage is RunningStage.TRAINING
    trainer.validating = True
    assert trainer.state.stage is RunningStage.VALIDATING


@pytest.mark.guard
def test_the_deprecated_member_still_warns():
    from pytorch_lightning.trainer.states import RunningStage

    with pytest.deprecated_call(match="`RunningStage.TUNING` has been deprecated"):
        RunningStage.TUNING
