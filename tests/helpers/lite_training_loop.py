"""``TrainingLoop``: a ``LightningLite`` that runs a few SGD steps of a small classifier and reports where its tensors
lived, whether the weights moved and its losses. A module of its own so that a spawned or fresh process (which
unpickles it by its module path) can import it: ``tests_lite/strategies/test_xla_pjrt.py``."""
import os

import torch
from torch import nn

from lightning_lite import LightningLite


class TrainingLoop(LightningLite):
    """A few SGD steps of a small classifier; records where tensors live."""

    def run(self, steps: int = 3) -> dict:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        model, optimizer = self.setup(model, optimizer)
        before = [p.detach().cpu().clone() for p in model.parameters()]
        x = torch.randn(8, 16, device=self.device)
        y = torch.randint(0, 4, (8,), device=self.device)
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            self.backward(loss)
            optimizer.step()
            losses.append(loss.item())
        after = [p.detach().cpu() for p in model.parameters()]
        return {
            "param_devices": sorted({p.device.type for p in model.parameters()}),
            "optimizer_param_devices": sorted(
                {p.device.type for group in optimizer.param_groups for p in group["params"]}
            ),
            "input_device": x.device.type,
            "changed": [not torch.equal(b, a) for b, a in zip(before, after)],
            "losses": losses,
            "pid": os.getpid(),
        }
