"""Checkpoints that hold random states load with plain ``torch.load`` under torch's default ``weights_only=True``.

NumPy's random state is kept with its key array as a tensor (``0069-compat-numpy-random-state-loads-with-torch-load``,
a compat patch: no ``FIXED_BY``): torch's safe unpickler refuses NumPy arrays, so a checkpoint holding
``np.random.get_state()`` failed ``torch.load(path)`` ("Unsupported global: GLOBAL
numpy._core.multiarray._reconstruct"). The random states of 1.8.6's own form still restore.
"""
import io
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.runif import RunIf
from tests_pytorch.trainer.connectors.test_xla_preemption import PREEMPTED, _preempted_once


def _draws():
    return np.random.rand(4).tolist(), random.random(), torch.rand(3).tolist()


def test_random_states_go_through_plain_torch_load_and_draw_the_same_numbers():
    from lightning_lite.utilities.seed import _collect_rng_states, _set_rng_states

    np.random.seed(3)
    random.seed(4)
    torch.manual_seed(5)
    np.random.rand(7)  # a key array that is not the seed's
    states = _collect_rng_states()
    expected = _draws()
    buffer = io.BytesIO()
    torch.save({"rng": states}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # torch 2.9's default: weights only
    assert isinstance(loaded["rng"]["numpy"][1], torch.Tensor)
    _set_rng_states(loaded["rng"])
    assert _draws() == expected


def test_a_random_state_of_lightning_1_8_6_s_form_still_restores():
    from lightning_lite.utilities.seed import _collect_rng_states, _set_rng_states

    np.random.seed(11)
    old = {**_collect_rng_states(), "numpy": np.random.get_state()}
    expected = np.random.rand(5).tolist()
    _set_rng_states(old)
    assert np.random.rand(5).tolist() == expected


def _plain_load(path: Path) -> subprocess.CompletedProcess:
    """``torch.load(path)`` in a fresh interpreter, as a user takes a state dict into plain PyTorch: torch's defaults,
    nothing of Lightning imported, no variable that changes what ``torch.load`` accepts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    code = ("import sys, torch\nckpt = torch.load(sys.argv[1])\n"
            "print(sorted(ckpt), sorted(ckpt['state_dict']))")
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                          timeout=300)


@RunIf(xla=True)
@pytest.mark.slow
def test_a_preemption_checkpoint_loads_with_plain_torch_load(tmp_path, fork_server):
    _preempted_once(fork_server, tmp_path, "single", {"PJRT_DEVICE": "CPU"}, PREEMPTED)
    proc = _plain_load(tmp_path / "checkpoints" / "last-preempted.ckpt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'xla_preemption'" in proc.stdout and "'state_dict'" in proc.stdout
