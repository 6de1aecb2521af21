"""Checkpoints written on XLA hold what the hyperparameters hold: enums, classes and ``AttributeDict``.

``XLACheckpointIO`` wrote through ``xm.save``, which rewrites the ``__dict__`` of every object it meets to find the XLA
tensors: an enum member or a class among the hyperparameters made every save fail with "'mappingproxy' object does
not support item assignment", and an ``AttributeDict`` came back as a plain ``dict``.
"""
import pytest
import torch
from torch import nn

from helpers.hparams_model import Activation, hparams_loader, hparams_trainer, Model
from helpers.runif import RunIf

pytest.importorskip("torch_xla")

from lightning_lite.plugins import XLACheckpointIO  # noqa: E402
from pytorch_lightning.callbacks import ModelCheckpoint  # noqa: E402
from pytorch_lightning.utilities.parsing import AttributeDict  # noqa: E402

FIXED_BY = "0030-xla-checkpoints-save-enums-and-classes.patch"


@RunIf(xla=True)
def test_checkpoint_with_enum_class_and_attribute_dict_hyperparameters(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)
    trainer = hparams_trainer(tmp_path, callbacks=[checkpoint])
    model = Model()
    trainer.fit(model, hparams_loader())  # the end-of-epoch save raised TypeError ("'mappingproxy' ...") here
    trainer.save_checkpoint(tmp_path / "manual.ckpt")

    for path in (checkpoint.last_model_path, tmp_path / "manual.ckpt"):
        # a class is not in torch's allowlist: this is a file the test trusts
        saved = torch.load(path, weights_only=False)
        hparams = saved["hyper_parameters"]
        assert hparams["activation"] is Activation.TANH
        assert hparams["block"] is nn.Linear
        assert type(hparams["extra"]) is AttributeDict and hparams["extra"].depth == 2
        # the tensors were copied to the CPU, the weights are the trained ones
        assert all(t.device.type == "cpu" for t in saved["state_dict"].values())
        torch.testing.assert_close(saved["state_dict"]["net.0.weight"], model.net[0].weight.detach().cpu())
        adam_state = saved["optimizer_states"][0]["state"][0]
        assert adam_state["exp_avg"].device.type == "cpu" and int(adam_state["step"]) == 4
    # loading such a file back through Lightning (`weights_only=False`, a class is beyond torch's allowlist) and
    # resuming from it: test_checkpoint_safe_load.py, since that takes the safe-unpickler patch as well


@RunIf(xla=True)
def test_save_copies_every_xla_tensor_in_one_transfer(tmp_path, xla_metrics):
    """The tensors come to the host as ``xm.save`` brought them: all in one execution and one transfer."""
    import torch_xla

    device = torch_xla.device()
    weights = {f"w{i}": torch.full((3,), float(i), device=device) * 2 for i in range(6)}
    checkpoint = {"state_dict": weights, "hyper_parameters": {"activation": Activation.RELU},
                  "on_cpu": torch.arange(3)}
    xla_metrics.clear()
    XLACheckpointIO().save_checkpoint(checkpoint, tmp_path / "x.ckpt")
    assert (xla_metrics.executions(), xla_metrics.transfers()) == (1, 1)  # the pending products, then their copy

    saved = torch.load(tmp_path / "x.ckpt", weights_only=False)
    assert saved["hyper_parameters"]["activation"] is Activation.RELU
    for i in range(6):
        torch.testing.assert_close(saved["state_dict"][f"w{i}"], torch.full((3,), 2.0 * i))
    torch.testing.assert_close(saved["on_cpu"], torch.arange(3))
    # the checkpoint handed in is not modified: the live tensors stay on the device
    assert all(t.device.type == "xla" for t in checkpoint["state_dict"].values())
