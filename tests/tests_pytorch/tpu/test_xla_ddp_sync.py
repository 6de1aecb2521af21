"""DDP on a TPU: replicas that see different data end every step with the same parameters, and those are the
parameters of one device trained on the concatenated batch.

Needs real TPU hardware (collectives hang on XLA:CPU). The training runs in a fresh process (see
``helpers/ddp_sync_worker.py``) that spawns one replica per TPU device of this host; each replica writes its
parameters, and this test compares them. On a multi-host pod slice every host runs the same thing: the
replicas of this host are compared to each other and to the single-device reference computed from the data
of *all* replicas of the slice, which is deterministic and rebuilt here.

Without the DDP fix the gradients are all-reduced before the backward pass of the step that uses them, so
each replica steps with its own gradients only and the replicas drift apart.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ddp_sync_worker as worker
from helpers.ddp_replicas import LR, cpu_params, max_diff
from helpers.runif import RunIf

FIXED_BY = "0005-tpu-reduce-gradients-inside-the-closure.patch"
PROBLEM = worker.PROBLEM
DIVERGED = "replicas diverged: gradients were not all-reduced; is 0005-tpu-reduce-gradients-inside-the-closure applied?"


def _run_and_check(tmp_path: Path, pjrt_device: str, min_replicas: int) -> int:
    """Run the worker, check every replica against the others and the one-device reference; return the count."""
    env = dict(os.environ, PJRT_DEVICE=pjrt_device)
    proc = subprocess.run([sys.executable, str(Path(worker.__file__)), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"DDP run failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"

    results = [torch.load(p) for p in sorted(tmp_path.glob("rank*.pt"))]
    assert results, f"no replica wrote its parameters:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    world_size = results[0]["world_size"]
    assert world_size >= min_replicas, f"needs at least {min_replicas} replicas; this host shows {world_size}"
    assert all(r["world_size"] == world_size for r in results)
    # this host's replicas: local ranks 0..n-1, all present (every host of a pod slice writes its own)
    assert sorted(r["local_rank"] for r in results) == list(range(len(results)))
    assert all(r["steps"] == PROBLEM.steps for r in results), [r["steps"] for r in results]

    init = torch.load(tmp_path / "init.pt")
    first = results[0]["params"]
    assert max_diff(first, init) > 1e-3, "the parameters did not move: no training happened"

    spread = max(max_diff(r["params"], first) for r in results)
    # a diverged run differs by ~1e-2 after 4 steps at lr 0.5; equal replicas by float rounding at most
    assert spread < 1e-5, f"{DIVERGED} (largest difference between replicas: {spread:.3g})"

    expected = PROBLEM.reference_params(init, world_size)
    # fp32 with full-precision matmuls is within ~1e-6 of fp64; bf16-pass matmuls within ~1e-3
    tol = 2e-4 if results[0]["highest_precision"] else 5e-3
    for r in results:
        err = max_diff(r["params"], expected)
        assert err < tol, (
            f"replica {r['global_rank']} differs from one device on the concatenated batch by {err:.3g}: "
            f"{DIVERGED}"
        )
    return world_size


@RunIf(tpu=True)
def test_replicas_stay_in_sync_and_match_one_device(tmp_path):
    _run_and_check(tmp_path, "TPU", min_replicas=2)


@pytest.mark.guard  # checks the harness itself; one device has nothing to sync, before or after the fix
@pytest.mark.slow
@RunIf(xla=True)
def test_the_harness_on_one_xla_device(tmp_path):
    """The same worker and checks on one XLA device (XLA:CPU here): no DDP, but the harness itself is exercised."""
    if os.environ.get("PJRT_DEVICE", "").upper() == "TPU":
        pytest.skip("on a TPU the multi-replica test above covers this")
    assert _run_and_check(tmp_path, os.environ["PJRT_DEVICE"], min_replicas=1) == 1


@pytest.mark.guard  # checks the reference computation itself, independent of the fix
def test_reference_is_sensitive_to_the_gradient_average():
    """The reference is not a tautology: skipping the average (local gradients only) lands far from it.

    Runs on the CPU: it checks the test's own yardstick, not the fork.
    """
    world_size = 4
    init = cpu_params(PROBLEM.make_model())
    expected = PROBLEM.reference_params(init, world_size)

    # what one replica ends with when it only ever sees its own gradients
    local = PROBLEM.make_model()
    local.load_state_dict(init)
    opt = torch.optim.SGD(local.parameters(), lr=LR)
    for x, y in PROBLEM.replica_batches(0, world_size):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(local(x), y).backward()
        opt.step()
    assert max_diff(local.state_dict(), expected) > 1e-2

    # and averaging the replicas' gradients by hand reproduces the reference (fp32 vs fp64: tiny)
    models = []
    for _ in range(world_size):
        m = PROBLEM.make_model()
        m.load_state_dict(init)
        models.append(m)
    opts = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    batches = [PROBLEM.replica_batches(r, world_size) for r in range(world_size)]
    for step in range(PROBLEM.steps):
        for r, (m, o) in enumerate(zip(models, opts)):
            o.zero_grad()
            x, y = batches[r][step]
            torch.nn.functional.cross_entropy(m(x), y).backward()
        for params in zip(*(m.parameters() for m in models)):
            mean = torch.stack([p.grad for p in params]).mean(0)
            for p in params:
                p.grad = mean.clone()
        for o in opts:
            o.step()
    assert max_diff(models[0].state_dict(), expected) < 1e-5
