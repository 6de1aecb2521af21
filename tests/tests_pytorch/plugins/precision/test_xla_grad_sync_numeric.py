"""DDP on XLA averages the gradients on every path users train with, and exactly once per update (fix
`tpu-reduce-gradients-inside-the-closure`).

One XLA:CPU replica with a world size of 2 simulated (``helpers.simulated_ddp``): torch_xla's real all-reduce runs
in the step's graph and halves a gradient it reaches. Each test trains through the Trainer and compares the
parameters with plain PyTorch on the CPU that averages where DDP on GPUs averages: right after ``backward``, before
``on_after_backward``, clipping and the update.
"""
import pytest
import torch

from helpers.runif import RunIf
from helpers.simulated_ddp import (  # noqa: F401 (fixture)
    EDITS, LR, assert_params, batches, clip_case, edit_gradients, expected_after_edit, fit, grad_norm, halve,
    lbfgs_reference, local_grads, loss_fn, make_net, module_class, sgd_update, world_size_2)

FIXED_BY = "0005-tpu-reduce-gradients-inside-the-closure.patch"


@RunIf(xla=True)
def test_automatic(tmp_path, world_size_2):
    module = module_class()()
    net0 = make_net()
    before, after = fit(module, tmp_path)
    local = local_grads(net0, batches(1))
    assert_params(after, sgd_update(net0, halve(local)), before)
    # ``on_after_backward`` already sees the averaged gradients, as with DDP on GPUs
    assert module.seen["after_backward_norm"] == pytest.approx(grad_norm(halve(local)), rel=1e-4)


@pytest.mark.parametrize("edit", EDITS)
@RunIf(xla=True)
def test_automatic_user_edits_gradients_in_on_after_backward(tmp_path, world_size_2, edit):
    net0 = make_net()
    local = local_grads(net0, batches(1))

    def hook(module):
        edit_gradients(list(module.net.parameters()), edit, local)

    before, after = fit(module_class()(on_after_backward=hook), tmp_path)
    assert_params(after, sgd_update(net0, expected_after_edit(local, edit)), before)


@RunIf(xla=True)
def test_user_hook_edits_gradients_before_the_step(tmp_path, world_size_2):
    """A callback-style edit in ``on_before_optimizer_step`` (after the reduce) keeps the reduce."""

    def hook(module):
        for p in module.net.parameters():
            p.grad.detach().mul_(2.0)

    net0 = make_net()
    before, after = fit(module_class()(on_before_optimizer_step=hook), tmp_path)
    assert_params(after, sgd_update(net0, [g for g in local_grads(net0, batches(1))]), before)  # 2 * g / 2


@pytest.mark.parametrize("algorithm", ["norm", "value"])
@RunIf(xla=True)
def test_trainer_gradient_clipping(tmp_path, world_size_2, algorithm):
    net0 = make_net()
    clip_val, expected = clip_case(local_grads(net0, batches(1)), algorithm)
    before, after = fit(module_class()(), tmp_path, gradient_clip_val=clip_val, gradient_clip_algorithm=algorithm)
    assert_params(after, sgd_update(net0, expected), before)


@RunIf(xla=True)
def test_automatic_gradient_accumulation_reduces_once_per_update(tmp_path, world_size_2):
    net0 = make_net()
    before, after = fit(module_class()(), tmp_path, accumulate_grad_batches=2)
    # Lightning scales the loss by 1 / accumulate_grad_batches; the accumulated sum is averaged once
    local = local_grads(net0, batches(2), scale=0.5)
    assert_params(after, sgd_update(net0, halve(local)), before)


@pytest.mark.guard  # the user's backward ran before `xm.optimizer_step`, whose reduce was right without clipping
@RunIf(xla=True)
def test_manual(tmp_path, world_size_2):
    def step(module, batch, batch_idx):
        opt = module.optimizers()
        opt.zero_grad()
        module.manual_backward(loss_fn(module.net, batch))
        opt.step()

    net0 = make_net()
    before, after = fit(module_class()(automatic=False, manual_step=step), tmp_path)
    assert_params(after, sgd_update(net0, halve(local_grads(net0, batches(1)))), before)


@pytest.mark.parametrize("algorithm", ["norm", "value"])
@RunIf(xla=True)
def test_manual_with_clip_gradients(tmp_path, world_size_2, algorithm):
    net0 = make_net()
    clip_val, expected = clip_case(local_grads(net0, batches(1)), algorithm)

    def step(module, batch, batch_idx):
        opt = module.optimizers()
        opt.zero_grad()
        module.manual_backward(loss_fn(module.net, batch))
        module.clip_gradients(opt, gradient_clip_val=clip_val, gradient_clip_algorithm=algorithm)
        opt.step()

    before, after = fit(module_class()(automatic=False, manual_step=step), tmp_path)
    assert_params(after, sgd_update(net0, expected), before)


def _manual_accumulation(tmp_path, block):
    """Two micro-batches, one update: the sum of both local gradients must be averaged once."""
    from contextlib import nullcontext

    def step(module, batch, batch_idx):
        opt = module.optimizers()
        if batch_idx % 2 == 0:
            opt.zero_grad()
        last = batch_idx % 2 == 1
        plugin = module.trainer.strategy.precision_plugin
        with plugin._xla_grad_sync.blocked() if (block and not last) else nullcontext():
            module.manual_backward(loss_fn(module.net, batch))
        if last:
            opt.step()

    net0 = make_net()
    before, after = fit(module_class()(automatic=False, manual_step=step), tmp_path, max_steps=1,
                         limit_train_batches=2)
    assert_params(after, sgd_update(net0, halve(local_grads(net0, batches(2)))), before)


@pytest.mark.guard  # the reduce ran once, in `xm.optimizer_step`, on the accumulated gradients
@RunIf(xla=True)
def test_manual_gradient_accumulation_syncing_every_backward(tmp_path, world_size_2):
    """Every ``manual_backward`` reduces (DDP's default), the second one only what it added: averaged once."""
    _manual_accumulation(tmp_path, block=False)


@RunIf(xla=True)
def test_manual_gradient_accumulation_with_blocked_sync(tmp_path, world_size_2):
    """The first micro-batch's gradients stay local (``block_backward_sync``); the last backward averages the sum."""
    _manual_accumulation(tmp_path, block=True)


@RunIf(xla=True)
def test_tpu_spawn_block_backward_sync_blocks_the_plugins_reduce():
    from pytorch_lightning.plugins.precision import TPUPrecisionPlugin
    from pytorch_lightning.strategies import TPUSpawnStrategy

    plugin = TPUPrecisionPlugin()
    strategy = TPUSpawnStrategy(precision_plugin=plugin)
    assert not plugin._xla_grad_sync.is_blocked
    with strategy.block_backward_sync():
        assert plugin._xla_grad_sync.is_blocked
    assert not plugin._xla_grad_sync.is_blocked


@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
@RunIf(xla=True)
def test_two_optimizers(tmp_path, world_size_2, automatic):
    """Optimizer 0 steps the first layer, then optimizer 1 the last one with a loss computed after that update. In
    manual optimization both ``manual_backward`` calls reach every parameter: the second adds to the first layer's
    averaged gradient, and only what it adds is averaged (the first layer's gradient is not halved again)."""
    from pytorch_lightning import LightningModule

    class TwoOptimizers(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_net()
            self.automatic_optimization = automatic

        def automatic_step(self, batch, batch_idx, optimizer_idx):
            return loss_fn(self.net, batch)

        def manual_step(self, batch, batch_idx):
            for opt in self.optimizers():
                opt.zero_grad()
                self.manual_backward(loss_fn(self.net, batch))
                opt.step()

        # in manual optimization Lightning refuses a training_step that takes `optimizer_idx`
        training_step = automatic_step if automatic else manual_step

        def configure_optimizers(self):
            return [torch.optim.SGD(self.net[0].parameters(), lr=LR), torch.optim.SGD(self.net[2].parameters(), lr=LR)]

        def train_dataloader(self):
            return torch.utils.data.DataLoader(batches(4), batch_size=None)

    net0 = make_net()
    module = TwoOptimizers()
    before, after = fit(module, tmp_path)
    # optimizer 0 updates the first layer with the averaged gradient of the loss
    first = sgd_update(net0, halve(local_grads(net0, batches(1))))
    for name in ("0.weight", "0.bias"):
        assert_params({name: after[name]}, {name: first[name]}, before)
    # optimizer 1 then computes the loss again, with the first layer updated, for the last layer
    net1 = make_net()
    with torch.no_grad():
        for name, p in net1.named_parameters():
            if name.startswith("0."):
                p.copy_(first[name])
    second = sgd_update(net1, halve(local_grads(net1, batches(1))))
    for name in ("2.weight", "2.bias"):
        assert_params({name: after[name]}, {name: second[name]}, before)
    if not automatic:
        # the first layer's gradient after the second backward: averaged first one + averaged second contribution
        first_grads = halve(local_grads(net0, batches(1)))[:2]
        second_grads = halve(local_grads(net1, batches(1)))[:2]
        for p, a, b in zip(module.net[0].parameters(), first_grads, second_grads):
            assert torch.allclose(p.grad.cpu().double(), a + b, atol=1e-5), "first layer gradient != averaged first backward + averaged second backward"


@RunIf(xla=True)
def test_lbfgs(tmp_path, world_size_2):
    kwargs = dict(lr=0.5, max_iter=3, history_size=3)
    net0 = make_net()
    module = module_class()(optimizer=lambda params: torch.optim.LBFGS(params, **kwargs))
    before, after = fit(module, tmp_path)

    def average(grads):
        for g in grads:
            g.mul_(0.5)

    assert_params(after, lbfgs_reference(net0, batches(1)[0], average, **kwargs), before, atol=1e-4, rtol=1e-3)
