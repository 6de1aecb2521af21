"""Smoke test of examples/mnist_tpu_ddp.py on one XLA device (XLA:CPU here, a TPU core on a TPU VM).

The DDP part (several replicas, the replica spread) needs a TPU; scripts/ddp_evidence.sh runs it there.
"""
import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.runif import RunIf

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mnist_tpu_ddp.py"


@pytest.mark.slow
@RunIf(xla=True)
def test_mnist_example_trains_three_steps_on_one_device(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--max-steps", "3", "--devices", "1", "--synthetic", "--arch", "mlp",
         "--log-every", "1", "--out", str(out), "--data-dir", str(tmp_path / "data")],
        cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    rows = list(csv.DictReader(open(out / "losses.csv")))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    losses = [float(r["loss"]) for r in rows]
    assert all(math.isfinite(v) and v > 0 for v in losses), losses
    # ten balanced classes at initialisation: a cross-entropy near ln(10), not a constant or garbage
    assert 1.0 < losses[0] < 4.0, losses
    assert [float(r["replica_spread"]) for r in rows] == [0.0, 0.0, 0.0]  # one replica
    assert (out / "replicas.txt").read_text().strip() == "1"
    assert "synthetic" in (out / "data.txt").read_text()
    events = list((out / "tb").rglob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0, "TensorBoardLogger wrote no event file"


def test_synthetic_stand_in_is_deterministic_and_mnist_shaped():
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("mnist_tpu_ddp_under_test", EXAMPLE)
        example = importlib.util.module_from_spec(spec)
        # importing sets PJRT_DEVICE only when unset and starts no XLA runtime
        spec.loader.exec_module(example)
    finally:
        sys.path.pop(0)
    a, b = example.synthetic_mnist(256), example.synthetic_mnist(256)
    x, y = a.tensors
    assert x.shape == (256, 1, 28, 28) and y.shape == (256,)
    assert set(y.tolist()) == set(range(10))
    assert all((t1 == t2).all() for t1, t2 in zip(a.tensors, b.tensors))
    # the classes are separable: each image is nearest to its own class mean
    means = [x[y == c].mean(0) for c in range(10)]
    dist = (x.unsqueeze(1) - torch.stack(means).unsqueeze(0)).pow(2).flatten(2).sum(-1)
    assert (dist.argmin(1) == y).float().mean() > 0.9
