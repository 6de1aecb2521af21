"""``self.log`` copies a logged tensor after detaching it, and leaves a 0-dim tensor unsqueezed.

The copy was made first and detached afterwards, so the copy was recorded in the autograd graph of the loss only to
be cut off again; and every value was squeezed, although a 0-dim tensor (a loss, usually) has nothing to squeeze. On
XLA each of these is one more operation traced into the step. The logged value is the same: a detached copy with one
element and no dimensions.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

FIXED_BY = "0046-log-copies-a-detached-tensor.patch"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _log_in_training_step(tmp_path, make_value):
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    seen = {}

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            value = make_value(out["loss"])
            with _Ops() as mode:
                self.log("value", value)
            seen["ops"] = mode.ops
            seen["logged"] = self.trainer._results["training_step.value"].value
            seen["source"] = value
            return out

    trainer = Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=1, limit_train_batches=1,
                      limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    trainer.fit(Model())
    return seen


def test_a_0_dim_loss_is_copied_detached_and_not_squeezed(tmp_path):
    seen = _log_in_training_step(tmp_path, lambda loss: loss)
    # before: clone, detach, squeeze (the clone recorded as a node of the loss's graph)
    assert "squeeze" not in seen["ops"]
    assert seen["ops"].index("detach") < seen["ops"].index("clone")


@pytest.mark.guard
@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_the_logged_value_is_a_detached_0_dim_copy(tmp_path, shape):
    seen = _log_in_training_step(tmp_path, lambda loss: loss.reshape(shape) * 1.0)
    logged, source = seen["logged"], seen["source"]
    assert logged.dim() == 0 and logged.grad_fn is None and not logged.requires_grad
    assert logged.item() == pytest.approx(source.detach().reshape(()).item())
    # a copy: changing the logged tensor's source does not change it
    before = logged.item()
    with torch.no_grad():
        source.add_(1.0)
    assert logged.item() == before
