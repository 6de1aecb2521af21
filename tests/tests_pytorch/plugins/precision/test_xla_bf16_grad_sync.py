"""The bf16 plugin averages the bfloat16 gradients once, right after backward, with the closure's loss in the call.

The numeric harness of ``test_xla_grad_sync_numeric.py``, ``helpers/simulated_ddp.py`` (one XLA:CPU replica, a world
size of 2 simulated). The call's operands are the converted parameters' gradients and the loss the optimizer's
closure returns, all bfloat16: the module conversion and the loss in the gradients' all-reduce are both needed.
"""
import pytest
import torch

from helpers.runif import RunIf
from helpers.simulated_ddp import (  # noqa: F401 (fixture)
    batches, fit, halve, local_grads, make_net, module_class, sgd_update, state, world_size_2)

FIXED_BY = "0021-xla-closure-optimizers-decide-from-the-averaged-loss.patch"


@RunIf(xla=True)
def test_bf16_plugin_reduces_too(tmp_path, world_size_2, monkeypatch):
    """The bf16 plugin averages the (bfloat16) gradients once, right after backward.

    XLA:CPU cannot all-reduce bfloat16 ("AllReduce for datatype 'bf16' is not supported"), so here the all-reduce of
    one replica is emulated in place (sum over one replica, scaled): this checks where and how often the plugin
    reduces, not torch_xla's bf16 collective, which the TPU tests exercise.
    """
    import torch_xla.core.xla_model as xm

    from pytorch_lightning.plugins.precision import TPUBf16PrecisionPlugin

    calls = []

    def one_replica_all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
        assert reduce_type == xm.REDUCE_SUM and isinstance(inputs, list)
        calls.append([t.dtype for t in inputs])
        for t in inputs:
            t.mul_(scale)
        return inputs

    monkeypatch.setattr(xm, "all_reduce", one_replica_all_reduce)
    net0 = make_net()
    module = module_class()()
    start = {}
    module.on_train_start = lambda: start.update(state(module.net))
    _, after = fit(module, tmp_path, precision="bf16")
    assert isinstance(module.trainer.strategy.precision_plugin, TPUBf16PrecisionPlugin)
    # one all-reduce, over the four gradients in the dtype of the converted parameters and the closure's loss
    # (averaged for optimizers that decide from it: `xla-closure-optimizers-decide-from-the-averaged-loss`), all
    # bfloat16 (after fit, the parameters are float32 again)
    assert calls == [[torch.bfloat16] * (len(list(module.net.parameters())) + 1)], calls
    # the applied update is the averaged gradient's (bfloat16: compare the update, not the parameters)
    expected = sgd_update(net0, halve(local_grads(net0, batches(1))))
    for name in expected:
        applied = (start[name] - after[name]).flatten().double()
        wanted = (state(net0)[name] - expected[name]).flatten().double()
        ratio = float(applied.dot(wanted) / wanted.dot(wanted))
        assert ratio == pytest.approx(1.0, abs=0.05), f"{name}: applied / averaged update = {ratio:.3f}"
