"""Hooks that a callback or module inherits with an empty body are left out when nothing profiles them."""
import sys

import pytest

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0032-trainer-skips-inherited-empty-hooks.patch"


def _model_and_callbacks(log):
    from pytorch_lightning import Callback
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            log.append(("module", "on_train_batch_end", self._current_fx_name))

    class Overrides(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            log.append(("callback", "on_train_batch_end", pl_module._current_fx_name))

        def on_before_backward(self, trainer, pl_module, loss):
            log.append(("callback", "on_before_backward", pl_module._current_fx_name))

    class Inherits(Callback):
        pass

    return Model(), [Overrides(), Inherits()]


def _empty_hook_calls(run):
    """Calls of the empty hooks of Callback and the LightningModule hook classes made while ``run`` runs."""
    from pytorch_lightning import Callback
    from pytorch_lightning.core.hooks import ModelHooks

    empty = {
        Callback.on_before_backward.__code__, Callback.on_after_backward.__code__,
        Callback.on_before_zero_grad.__code__, Callback.on_before_optimizer_step.__code__,
        Callback.on_train_batch_start.__code__, Callback.on_train_batch_end.__code__,
        ModelHooks.on_before_backward.__code__, ModelHooks.on_after_backward.__code__,
        ModelHooks.on_before_zero_grad.__code__, ModelHooks.on_before_optimizer_step.__code__,
        ModelHooks.on_train_batch_start.__code__,
    }
    seen = []

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code in empty:
            seen.append(frame.f_code.co_name)

    sys.setprofile(tracer)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return seen, result


@RunIf(xla=True)
def test_inherited_empty_hooks_are_not_called(tmp_path):
    log = []
    model, callbacks = _model_and_callbacks(log)
    seen, _ = _empty_hook_calls(lambda: fit_on_xla(model, tmp_path, max_steps=3, callbacks=callbacks))
    assert seen == []
    # the overridden hooks run as before, with the module's current hook name set
    assert log.count(("callback", "on_before_backward", "on_before_backward")) == 3
    assert log.count(("callback", "on_train_batch_end", "on_train_batch_end")) == 3
    assert log.count(("module", "on_train_batch_end", "on_train_batch_end")) == 3


@RunIf(xla=True)
@pytest.mark.guard  # unchanged behaviour, right before the fix too
def test_a_recording_profiler_still_sees_every_hook(tmp_path):
    from pytorch_lightning.profilers import SimpleProfiler

    log = []
    model, callbacks = _model_and_callbacks(log)
    profiler = SimpleProfiler()
    seen, trainer = _empty_hook_calls(
        lambda: fit_on_xla(model, tmp_path, max_steps=3, callbacks=callbacks, profiler=profiler)
    )
    # every callback (none overrides it) and the module, every step
    assert seen.count("on_before_zero_grad") == 3 * (len(trainer.callbacks) + 1)
    actions = list(profiler.recorded_durations)
    assert any(a.startswith("[Callback]") and a.endswith("Inherits.on_before_zero_grad") for a in actions), actions
    assert "[LightningModule]Model.on_before_zero_grad" in actions
