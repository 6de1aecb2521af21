"""Spies that record the real order of events of a training step on an XLA device.

The spies call through to the real functions; only the order is recorded.
"""
import os
import sys
from typing import List, Tuple

import pytest
import torch

Event = Tuple[str, str]


class _Recorder:
    def __init__(self) -> None:
        self.events: List[Event] = []
        self.optimizers: List[torch.optim.Optimizer] = []

    def tag_of(self, tensors) -> str:
        """The tag of the recording optimizer whose parameters' ``.grad`` are among ``tensors``."""
        for opt in self.optimizers:
            grads = [p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None]
            if any(t is g for t in tensors for g in grads):
                return opt._fork_tag
        return "?"

    def add(self, what: str, tag: str = "") -> None:
        self.events.append((what, tag))

    def without(self, *kinds: str) -> List[Event]:
        """The events, leaving out those of the given kinds."""
        return [e for e in self.events if e[0] not in kinds]


def recording_optimizer(base, recorder: _Recorder, tag: str, **kwargs):
    """An instance of ``base`` that records ``zero_grad`` and the moment its update is applied."""

    class Recording(base):
        def zero_grad(self, set_to_none: bool = True) -> None:
            recorder.add("zero_grad", tag)
            super().zero_grad(set_to_none=set_to_none)

        def step(self, closure=None):
            if base is torch.optim.LBFGS:
                # LBFGS evaluates the closure itself, several times
                result = super().step(closure)
                recorder.add("step", tag)
                return result
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            recorder.add("step", tag)
            super().step()
            return loss

    opt = Recording(**kwargs)
    opt._fork_tag = tag
    recorder.optimizers.append(opt)
    return opt


def _called_by_the_device_loader() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("distributed", "parallel_loader.py")):
            return True
        frame = frame.f_back
    return False


@pytest.fixture
def recorder(monkeypatch):
    """Records the gradient all-reduce and the step barriers (``torch_xla.sync``/``xm.mark_step``) (and what the model and optimizers add).

    A world size of 2 is simulated (``torch_xla.runtime.world_size``) so that the gradients are all-reduced at all;
    the all-reduce of a list of tensors (what ``xm.reduce_gradients`` and the precision plugins run) is recorded as
    ``("reduce", tag)``, with the tag of the optimizer whose gradients it reduces.
    """
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    rec = _Recorder()
    monkeypatch.setattr(xr, "world_size", lambda: 2)
    real_all_reduce = xm.all_reduce

    def all_reduce_spy(reduce_type, inputs, *args, **kwargs):
        if isinstance(inputs, (list, tuple)):
            rec.add("reduce", rec.tag_of(inputs))
        return real_all_reduce(reduce_type, inputs, *args, **kwargs)

    # the barrier is `torch_xla.sync()` today and `xm.mark_step()` (which calls it) in trees before the port to
    # today's API: one event per barrier, whichever of the two the code calls
    import torch_xla

    real_mark_step, real_sync = xm.mark_step, torch_xla.sync
    inside = []

    def barrier_spy(real):
        def spy(*args, **kwargs):
            # torch_xla's device loader runs a barrier before it hands out each batch (nothing is pending then): it
            # is not one of the step's, whose order the tests check
            if not inside and not _called_by_the_device_loader():
                rec.add("mark_step")
            inside.append(True)
            try:
                return real(*args, **kwargs)
            finally:
                inside.pop()

        return spy

    monkeypatch.setattr(xm, "all_reduce", all_reduce_spy)
    monkeypatch.setattr(xm, "mark_step", barrier_spy(real_mark_step))
    monkeypatch.setattr(torch_xla, "sync", barrier_spy(real_sync))
    return rec


def model_class(recorder: _Recorder, n_optimizers: int = 1, optimizer=torch.optim.SGD, automatic: bool = True,
                 return_none: bool = False, **optimizer_kwargs):
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = automatic
            if n_optimizers == 2:
                self.other = torch.nn.Linear(32, 2)

        def training_step(self, batch, batch_idx, optimizer_idx=0):
            recorder.add("training_step", f"opt{optimizer_idx}")
            layer = self.other if optimizer_idx == 1 else self.layer
            loss = layer(batch).sum()
            if return_none:
                return None
            if not automatic:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                return None
            return loss

        def backward(self, loss, *args, **kwargs):
            recorder.add("backward")
            super().backward(loss, *args, **kwargs)

        def training_epoch_end(self, outputs):
            pass

        def configure_optimizers(self):
            kwargs = {"lr": 0.1, **optimizer_kwargs}
            opts = [recording_optimizer(optimizer, recorder, "opt0", params=self.layer.parameters(), **kwargs)]
            if n_optimizers == 2:
                opts.append(recording_optimizer(optimizer, recorder, "opt1", params=self.other.parameters(), **kwargs))
            return opts

    return Model


def fit_on_xla(model, tmp_path, **trainer_kwargs):
    """``Trainer.fit`` on one XLA device; quiet defaults that ``trainer_kwargs`` can override."""
    from pytorch_lightning import Trainer

    kwargs = dict(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    kwargs.update(trainer_kwargs)
    trainer = Trainer(**kwargs)
    trainer.fit(model)
    return trainer
