"""``LightningModule.state_dict()`` works after the Trainer that trained the module is gone (fix 0009)."""
import gc

import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0009-state-dict-after-the-trainer-is-gone.patch"


def _fit_in_a_function(accelerator: str, tmp_path):
    """Train and return only the model, as scripts that save the weights afterwards do."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def training_epoch_end(self, outputs):
            pass

    model = Model()
    Trainer(accelerator=accelerator, devices=1, max_steps=2, default_root_dir=tmp_path, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False).fit(model)
    return model


def test_state_dict_after_the_trainer_is_garbage_collected(tmp_path):
    model = _fit_in_a_function("cpu", tmp_path)
    gc.collect()
    state = model.state_dict()
    assert set(state) == {"layer.weight", "layer.bias"}
    assert torch.equal(state["layer.weight"], model.layer.weight.detach())
    torch.save(state, tmp_path / "weights.pt")


@RunIf(xla=True)
def test_state_dict_after_training_on_xla(tmp_path):
    model = _fit_in_a_function("tpu", tmp_path)
    gc.collect()
    state = model.state_dict()
    assert set(state) == {"layer.weight", "layer.bias"}


@pytest.mark.guard  # ShardedTensor attributes were in the state dict before the fix and must stay there
def test_sharded_tensor_attributes_are_still_saved(monkeypatch):
    """A ``ShardedTensor`` needs a process group to exist; a stand-in type checks that such attributes are still
    collected, under the keys PyTorch's hooks give them."""
    import torch.distributed._shard.sharded_tensor as sharded_tensor

    from pytorch_lightning.demos.boring_classes import BoringModel

    class FakeSharded:
        pass

    monkeypatch.setattr(sharded_tensor, "ShardedTensor", FakeSharded)
    model = BoringModel()
    top, inner = FakeSharded(), FakeSharded()
    model.top_shard = top
    model.layer.inner_shard = inner
    state = model.state_dict()
    assert state["top_shard"] is top and state["layer.inner_shard"] is inner
    # with a prefix, the keys are the ones PyTorch's own save and load hooks use
    prefixed = model.state_dict(prefix="model.")
    assert prefixed["model..top_shard"] is top and prefixed["model.layer.inner_shard"] is inner
