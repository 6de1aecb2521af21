"""The Trainer sets the module's current hook name without ``nn.Module.__setattr__``, unless the module overrides it."""
import sys

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0036-trainer-sets-hook-name-directly.patch"


def _fit_counting_setattr(model, tmp_path):
    calls = []
    code = torch.nn.Module.__setattr__.__code__

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is code and frame.f_locals.get("name") == "_current_fx_name":
            calls.append(frame.f_locals.get("value"))

    def on_step(step):
        if step == 2:
            sys.setprofile(tracer)
        if step == 4:
            sys.setprofile(None)

    model.on_step = on_step
    try:
        trainer = fit_on_xla(model, tmp_path, max_steps=6)
    finally:
        sys.setprofile(None)
    return calls, trainer


def _model_class():
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            self.on_step(batch_idx)
            out = super().training_step(batch, batch_idx)
            self.log("step_loss", out["loss"])
            self.names.append(self._current_fx_name)
            return out

        def on_before_backward(self, loss):
            self.names.append(self._current_fx_name)

    return Model


@RunIf(xla=True)
def test_hook_names_are_set_without_module_setattr(tmp_path):
    model = _model_class()()
    model.names = []
    calls, trainer = _fit_counting_setattr(model, tmp_path)
    # the precision plugin's own name for on_before_optimizer_step still goes through __setattr__: two per step
    assert len(calls) <= 2 * 2, calls
    assert model.names == ["training_step", "on_before_backward"] * 6
    assert "step_loss" in trainer.callback_metrics


@RunIf(xla=True)
@pytest.mark.guard  # unchanged behaviour, right before the fix too
def test_a_module_with_its_own_setattr_sees_every_name(tmp_path):
    seen = []

    class Watching(_model_class()):
        def __setattr__(self, name, value):
            if name == "_current_fx_name":
                seen.append(value)
            super().__setattr__(name, value)

    model = Watching()
    model.names = []
    model.on_step = lambda step: None
    fit_on_xla(model, tmp_path, max_steps=2)
    assert "training_step" in seen and "on_before_backward" in seen and "on_train_batch_end" not in seen
    assert model.names == ["training_step", "on_before_backward"] * 2
