"""``LightningModule.state_dict()`` works after the Trainer that trained the module is gone.

On torch >= 2.1 the fork registers no ``ShardedTensor`` state-dict hook (compat patch
`compat-no-sharded-tensor-hooks-on-torch-2-1`, as Lightning 2.x does):
PyTorch's hook inspected every attribute, including the dead weak proxy to the Trainer, and raised ``ReferenceError``.
"""
import gc

import torch

from helpers.runif import RunIf


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
