"""Numeric checks of the gradient all-reduce on one XLA:CPU replica, with a world size of 2 simulated.

With ``torch_xla.runtime.world_size`` patched to return 2, torch_xla's real all-reduce runs in the step's graph as a
sum over the one replica there is, scaled by 1/2: a reduce that takes effect halves the gradient, one that is lost
leaves it whole, one applied twice quarters it. The tests train a step through Lightning on the XLA device and
compare the parameters with plain PyTorch on the CPU that averages ("halves") the local gradient where DDP on GPUs
would, and applies the same clipping after it.
"""
import copy
from typing import Callable, Dict, Iterable, List, Optional

import pytest
import torch
from torch import nn

FEATURES = 8
OUT = 4
BATCH = 4
LR = 0.5


@pytest.fixture
def world_size_2(monkeypatch):
    """``torch_xla.runtime.world_size()`` returns 2 (one real replica): a reduce that takes effect halves."""
    import torch_xla.runtime as xr

    monkeypatch.setattr(xr, "world_size", lambda: 2)


def make_net(seed: int = 7) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, OUT))


def batches(n: int, seed: int = 11) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(BATCH, FEATURES, generator=g) for _ in range(n)]


def loss_fn(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return (net(x) - 1.0).pow(2).mean()


def local_grads(net: nn.Module, xs: Iterable[torch.Tensor], scale: float = 1.0) -> List[torch.Tensor]:
    """The gradient one replica computes alone on the CPU: the sum of ``scale * loss`` over ``xs``."""
    net = copy.deepcopy(net).double()
    net.zero_grad()
    for x in xs:
        (loss_fn(net, x.double()) * scale).backward()
    return [p.grad.detach().clone() for p in net.parameters()]


def sgd_update(net: nn.Module, grads: List[torch.Tensor], lr: float = LR) -> Dict[str, torch.Tensor]:
    """The parameters after one SGD step of ``net`` with ``grads``."""
    params = [p.detach().double() - lr * g for p, g in zip(net.parameters(), grads)]
    return {name: p.float() for (name, _), p in zip(net.named_parameters(), params)}


def clip_norm(grads: List[torch.Tensor], max_norm: float) -> List[torch.Tensor]:
    total = torch.norm(torch.stack([g.norm() for g in grads]))
    coef = min(1.0, max_norm / (float(total) + 1e-6))
    return [g * coef for g in grads]


def clip_value(grads: List[torch.Tensor], value: float) -> List[torch.Tensor]:
    return [g.clamp(-value, value) for g in grads]


def grad_norm(grads: List[torch.Tensor]) -> float:
    return float(torch.norm(torch.stack([g.norm() for g in grads])))


def max_abs(grads: List[torch.Tensor]) -> float:
    return max(float(g.abs().max()) for g in grads)


def assert_params(got: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor], before: Dict[str, torch.Tensor],
                  local: Optional[List[torch.Tensor]] = None, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """``got`` equals ``expected``; on failure, say how the applied update relates to the expected one."""
    for name in expected:
        g, e, b = got[name].float().cpu(), expected[name].float(), before[name].float()
        if not torch.allclose(g, e, atol=atol, rtol=rtol):
            applied, wanted = (b - g).flatten(), (b - e).flatten()
            ratio = float(applied.dot(wanted) / wanted.dot(wanted).clamp_min(1e-30))
            raise AssertionError(
                f"{name}: applied update / expected (averaged) update = {ratio:.3f} (1.000 = reduced once;"
                f" 2.000 = the reduce was lost; 0.500 = reduced twice); max diff {float((g - e).abs().max()):.2e}"
            )


def state(net: nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in net.named_parameters()}


def lbfgs_reference(net: nn.Module, x: torch.Tensor, average: Callable[[List[torch.Tensor]], None],
                    **lbfgs_kwargs) -> Dict[str, torch.Tensor]:
    """One LBFGS step on the CPU whose closure averages the gradient after every evaluation."""
    net = copy.deepcopy(net).double()
    opt = torch.optim.LBFGS(net.parameters(), **lbfgs_kwargs)

    def closure():
        opt.zero_grad()
        loss = loss_fn(net, x.double())
        loss.backward()
        average([p.grad for p in net.parameters()])
        return loss

    opt.step(closure)
    return {k: v.detach().float() for k, v in net.named_parameters()}


EDITS = ["clip_grad_norm_", "clip_grad_value_", "data_mul_", "detach_mul_"]


def clip_case(local: List[torch.Tensor], algorithm: str):
    """A clipping threshold that only a wrong order or a lost reduce crosses, and the gradients DDP would apply.

    Norm: between the averaged and the local norm. Value: below the largest averaged entry."""
    averaged = [g * 0.5 for g in local]
    if algorithm in ("norm", "clip_grad_norm_"):
        threshold = 0.75 * grad_norm(local)
        return threshold, clip_norm(averaged, threshold)
    threshold = 0.3 * max_abs(local)
    return threshold, clip_value(averaged, threshold)


def edit_gradients(params: List[torch.Tensor], edit: str, local: List[torch.Tensor]) -> None:
    """Edit the gradients in place the way user code does: torch's clipping (``clip_case`` thresholds) or an in-place
    multiplication by 1 through ``.data`` or ``.detach()`` (which changes no value)."""
    if edit in ("clip_grad_norm_", "clip_grad_value_"):
        threshold, _ = clip_case(local, edit)
        clip = torch.nn.utils.clip_grad_norm_ if edit == "clip_grad_norm_" else torch.nn.utils.clip_grad_value_
        clip(params, threshold)
    elif edit == "data_mul_":
        for p in params:
            p.grad.data.mul_(1.0)
    elif edit == "detach_mul_":
        for p in params:
            p.grad.detach().mul_(1.0)
    else:
        raise ValueError(f"unknown edit {edit!r}")


def expected_after_edit(local: List[torch.Tensor], edit: str) -> List[torch.Tensor]:
    """The gradients DDP applies when ``edit`` runs on the averaged gradients."""
    if edit in ("clip_grad_norm_", "clip_grad_value_"):
        return clip_case(local, edit)[1]
    return [g * 0.5 for g in local]


def halve(grads: List[torch.Tensor]) -> List[torch.Tensor]:
    """The local gradients averaged over the simulated world of 2 (the other replica's are the same)."""
    return [g * 0.5 for g in grads]


def module_class():
    """A ``LightningModule`` class (defined on call, so that importing this module imports no Lightning)."""
    from pytorch_lightning import LightningModule

    class Module(LightningModule):
        """Trains ``make_net()`` with SGD; the keyword arguments pick the path under test."""

        def __init__(self, automatic=True, on_after_backward=None, on_before_optimizer_step=None, manual_step=None,
                     optimizer=None):
            super().__init__()
            self.net = make_net()
            self.automatic_optimization = automatic
            self._after_backward = on_after_backward
            self._before_step = on_before_optimizer_step
            self._manual_step = manual_step
            self._optimizer = optimizer or (lambda params: torch.optim.SGD(params, lr=LR))
            self.seen = {}

        def training_step(self, batch, batch_idx):
            if self._manual_step is not None:
                self._manual_step(self, batch, batch_idx)
                return None
            return loss_fn(self.net, batch)

        def on_after_backward(self):
            self.seen.setdefault("after_backward_norm", grad_norm([p.grad.cpu() for p in self.net.parameters()]))
            if self._after_backward is not None:
                self._after_backward(self)

        def on_before_optimizer_step(self, optimizer, optimizer_idx):
            self.seen.setdefault("before_step_norm", grad_norm([p.grad.cpu() for p in self.net.parameters()]))
            if self._before_step is not None:
                self._before_step(self)

        def configure_optimizers(self):
            return self._optimizer(self.parameters())

        def train_dataloader(self):
            return torch.utils.data.DataLoader(batches(4), batch_size=None)

    return Module


def fit(module, tmp_path, **kwargs):
    """Train ``module`` one step (unless ``max_steps`` says otherwise) on the XLA device: its weights before and
    after."""
    from helpers.xla_recording import fit_on_xla

    before = state(module.net)
    fit_on_xla(module, tmp_path, **{"max_steps": 1, **kwargs})
    return before, state(module.net)
