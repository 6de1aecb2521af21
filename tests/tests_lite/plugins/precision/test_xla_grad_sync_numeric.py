"""Lite on XLA averages the gradients right after ``self.backward``, once per update, and the reduce survives
edits of the gradients (fix `tpu-reduce-gradients-inside-the-closure`).

One XLA:CPU replica with a world size of 2 simulated (``helpers.simulated_ddp``): torch_xla's real all-reduce halves
a gradient it reaches. The parameters after the step are compared with plain PyTorch on the CPU.
"""
import pytest
import torch

from helpers.runif import RunIf
from helpers.simulated_ddp import (  # noqa: F401 (fixture)
    EDITS, LR, assert_params, batches, edit_gradients, expected_after_edit, grad_norm, lbfgs_reference, local_grads,
    loss_fn, make_net, sgd_update, state, world_size_2)

FIXED_BY = "0005-tpu-reduce-gradients-inside-the-closure.patch"


def _halve(grads):
    return [g * 0.5 for g in grads]


def _run_lite(body, optimizer_factory=None):
    """Run ``body(lite, model, optimizer)`` in a Lite loop on one XLA device; return (before, after, net)."""
    from lightning_lite import LightningLite

    class Lite(LightningLite):
        def run(self):
            net = make_net()
            before = state(net)
            # on the device before the optimizer is made: LBFGS keeps its own list of the parameters
            net = net.to(self.device)
            factory = optimizer_factory or (lambda params: torch.optim.SGD(params, lr=LR))
            model, optimizer = self.setup(net, factory(net.parameters()))
            body(self, model, optimizer)
            return before, state(net)

    return Lite(accelerator="tpu", devices=1).run()


@pytest.mark.guard  # `xm.optimizer_step` reduced the gradients of the user's backward: right without edits
@RunIf(xla=True)
def test_lite_plain_step(world_size_2):
    def body(lite, model, optimizer):
        optimizer.zero_grad()
        lite.backward(loss_fn(model, batches(1)[0].to(lite.device)))
        optimizer.step()

    before, after = _run_lite(body)
    net0 = make_net()
    assert_params(after, sgd_update(net0, _halve(local_grads(net0, batches(1)))), before)


@pytest.mark.parametrize("edit", EDITS)
@RunIf(xla=True)
def test_lite_user_edits_gradients_between_backward_and_step(world_size_2, edit):
    net0 = make_net()
    local = local_grads(net0, batches(1))
    seen = {}

    def body(lite, model, optimizer):
        optimizer.zero_grad()
        lite.backward(loss_fn(model, batches(1)[0].to(lite.device)))
        params = list(model.parameters())
        seen["norm"] = grad_norm([p.grad.cpu() for p in params])
        edit_gradients(params, edit, local)
        optimizer.step()

    before, after = _run_lite(body)
    # user code after `self.backward` sees the averaged gradients
    assert seen["norm"] == pytest.approx(grad_norm(_halve(local)), rel=1e-4)
    assert_params(after, sgd_update(net0, expected_after_edit(local, edit)), before)


@pytest.mark.parametrize("optimizer", ["sgd", "lbfgs"])
@RunIf(xla=True)
def test_lite_closure_is_evaluated_before_the_reduce(world_size_2, optimizer):
    """``optimizer.step(closure)``: every evaluation's gradients are averaged before the optimizer reads them."""
    kwargs = dict(lr=0.5, max_iter=3, history_size=3)
    factory = (lambda p: torch.optim.LBFGS(p, **kwargs)) if optimizer == "lbfgs" else None
    evaluations = []

    def body(lite, model, opt):
        x = batches(1)[0].to(lite.device)

        def closure():
            opt.zero_grad()
            loss = loss_fn(model, x)
            lite.backward(loss)
            evaluations.append(1)
            return loss

        opt.step(closure)

    before, after = _run_lite(body, factory)
    net0 = make_net()
    if optimizer == "lbfgs":
        assert len(evaluations) > 1

        def average(grads):
            for g in grads:
                g.mul_(0.5)

        expected = lbfgs_reference(net0, batches(1)[0], average, **kwargs)
        assert_params(after, expected, before, atol=1e-4, rtol=1e-3)
    else:
        assert_params(after, sgd_update(net0, _halve(local_grads(net0, batches(1)))), before)


@pytest.mark.parametrize(
    "blocked",
    [
        # `xm.optimizer_step` reduced the summed gradients once before the fix too
        pytest.param(False, id="sync-every-backward", marks=pytest.mark.guard),
        pytest.param(True, id="blocked-then-step"),
    ],
)
@RunIf(xla=True)
def test_lite_accumulation_averages_the_sum_once(world_size_2, blocked):
    """Two ``self.backward`` calls, one step, the sum averaged once: when each backward syncs it reduces only what it
    added; when both are kept local, the step reduces them before the update (a reduce is never lost)."""
    from contextlib import nullcontext

    def body(lite, model, optimizer):
        optimizer.zero_grad()
        with lite._precision._xla_grad_sync.blocked() if blocked else nullcontext():
            for x in batches(2):
                lite.backward(loss_fn(model, x.to(lite.device)))
        optimizer.step()

    before, after = _run_lite(body)
    net0 = make_net()
    assert_params(after, sgd_update(net0, _halve(local_grads(net0, batches(2)))), before)


@RunIf(xla=True)
def test_xla_strategy_no_backward_sync_blocks_the_reduce():
    from lightning_lite.plugins.precision import TPUPrecision
    from lightning_lite.strategies import XLAStrategy

    precision = TPUPrecision()
    strategy = XLAStrategy(precision=precision)
    assert strategy._backward_sync_control is not None
    with strategy._backward_sync_control.no_backward_sync(torch.nn.Linear(1, 1)):
        assert precision._xla_grad_sync.is_blocked
    assert not precision._xla_grad_sync.is_blocked


@pytest.mark.guard  # with one replica there was nothing to reduce before the fix either
@RunIf(xla=True)
def test_one_replica_costs_nothing(xla_metrics):
    """With one replica (the real world size here) the plugin adds no op to the step: no clone, no all-reduce."""
    import torch_xla

    def body(lite, model, optimizer):
        for x in batches(2):
            optimizer.zero_grad()
            loss = loss_fn(model, x.to(lite.device))
            lite.backward(loss)
            optimizer.step()
            body.ir = torch_xla._XLAC._get_xla_tensors_text([p.grad for p in model.parameters()])

    _run_lite(body)
    assert "cross_replica_sum" not in body.ir and "clone" not in body.ir
