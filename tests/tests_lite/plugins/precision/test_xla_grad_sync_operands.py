"""With several XLA replicas, Lite averages the gradients of parameters only, and the same list on every replica.

One process with a simulated world size of 2 (``xr.world_size`` patched); ``xm.all_reduce`` is replaced by a recorder
of its operands, so nothing runs on a device. Before the fix the operands were the autograd leaves of the loss: an
input that requires a gradient was averaged too, and a module the loss did not reach was left out (on another replica
it may be reached: a different list, a hang on a TPU).
"""
import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0024-xla-every-replica-reduces-the-same-gradients.patch"


@pytest.fixture
def reduced(monkeypatch):
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    calls = []

    def record(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
        calls.append([tuple(t.shape) for t in inputs])
        return inputs

    monkeypatch.setattr(xr, "world_size", lambda: 2)
    monkeypatch.setattr(xm, "all_reduce", record)
    return calls


@RunIf(xla=True)
def test_an_input_that_requires_grad_is_not_averaged(reduced):
    from lightning_lite.plugins.precision import TPUPrecision

    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3, requires_grad=True)  # e.g. an adversarial example
    loss = layer(x).sum()
    TPUPrecision().backward(loss, None)
    assert reduced == [[(2, 3), (2,)]]
    assert x.grad is not None  # the input still has its own, local gradient


@RunIf(xla=True)
def test_backward_without_model_averages_every_module_set_up(reduced):
    from lightning_lite.plugins.precision import TPUPrecision
    from lightning_lite.strategies import XLAStrategy

    strategy = XLAStrategy(precision=TPUPrecision())
    used, unused = torch.nn.Linear(3, 2), torch.nn.Linear(3, 5)
    strategy.setup_module(used)
    strategy.setup_module(unused)
    with pytest.warns(UserWarning, match="2 parameter\\(s\\) that require a gradient got none"):
        strategy.backward(used(torch.randn(4, 3)).sum(), None)
    # the unused module's parameters are reduced too (as zeros), as another replica may reach them
    assert reduced == [[(2, 3), (2,), (5, 3), (5,)]]
    assert torch.equal(unused.weight.grad, torch.zeros(5, 3))
