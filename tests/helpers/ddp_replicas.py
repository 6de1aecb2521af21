"""The small data-parallel problem that the DDP workers train and their tests check against one device.

``ddp_sync_worker.py`` (one replica per TPU device of a host) and ``ddp_two_process_worker.py`` (two XLA:CPU
processes whose all-reduce goes over gloo) train the same network on the same kind of data; each fixes its own number
of steps and seed with a ``DDPProblem``. Here live what both need: the hyperparameters, the model, the data, the rows
of each replica, the one-device reference the replicas must match, and the distance between two sets of parameters.

The rows of a run with ``W`` replicas: step ``s`` of replica ``r`` trains on rows
``[(s * W + r) * BATCH, (s * W + r + 1) * BATCH)`` of ``full_data(W)``. The replicas of one step together hold the
contiguous block ``s``, rank 0's rows first, which is what one device trains on in the reference.
"""
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

BATCH = 8  # rows per replica and step
FEATURES = 16
HIDDEN = 32
CLASSES = 4
LR = 0.5

Batch = Tuple[torch.Tensor, torch.Tensor]
Params = Dict[str, torch.Tensor]


@dataclass(frozen=True)
class DDPProblem:
    """A run of ``steps`` SGD steps whose initial parameters and data come from ``seed``."""

    steps: int
    seed: int

    def make_model(self) -> torch.nn.Module:
        """The same initial parameters in every process (fixed seed)."""
        torch.manual_seed(self.seed)
        return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))

    def full_data(self, world_size: int) -> Batch:
        """Every row of the run, ``steps * world_size * BATCH``, drawn on the CPU from the seed."""
        g = torch.Generator().manual_seed(self.seed + 1)
        n = self.steps * world_size * BATCH
        return torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)

    def replica_batches(self, rank: int, world_size: int) -> List[Batch]:
        """The batch of ``rank`` for every step, in step order (different for every rank)."""
        x, y = self.full_data(world_size)
        out = []
        for step in range(self.steps):
            start = (step * world_size + rank) * BATCH
            out.append((x[start:start + BATCH], y[start:start + BATCH]))
        return out

    def shard(self, rank: int, world_size: int) -> Batch:
        """The rows of ``rank``, all steps' batches one after the other."""
        batches = self.replica_batches(rank, world_size)
        return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])

    def reference_params(self, init: Params, world_size: int) -> Params:
        """Plain PyTorch on the CPU in float64: one device, each step on the concatenation of every replica's batch
        of that step (mean cross-entropy over it = the average of the replicas' mean losses)."""
        model = self.make_model().double()
        model.load_state_dict({k: v.double() for k, v in init.items()})
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        x, y = self.full_data(world_size)
        rows = world_size * BATCH
        for step in range(self.steps):
            optimizer.zero_grad()
            block = slice(step * rows, (step + 1) * rows)
            torch.nn.functional.cross_entropy(model(x[block].double()), y[block]).backward()
            optimizer.step()
        return {k: v.detach().float() for k, v in model.state_dict().items()}


def cpu_params(model: torch.nn.Module) -> Params:
    """A copy of ``model``'s parameters and buffers on the CPU."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def max_diff(a: Params, b: Params) -> float:
    """The largest absolute difference between two sets of parameters with the same names."""
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
