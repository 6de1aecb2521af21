"""Checkpoints that hold random states load with plain ``torch.load`` under torch's default ``weights_only=True``.

NumPy's random state is kept with its key array as a tensor (``0069-compat-numpy-random-state-loads-with-torch-load``,
a compat patch: no ``FIXED_BY``): torch's safe unpickler refuses NumPy arrays, so a checkpoint holding
``np.random.get_state()`` failed ``torch.load(path)`` ("Unsupported global: GLOBAL
numpy._core.multiarray._reconstruct"). The random states of 1.8.6's own form still restore. A real preemption
checkpoint loads with plain ``torch.load``: ``tests_pytorch/trainer/connectors/test_xla_preemption.py::
test_a_preemption_checkpoint_loads_with_plain_torch_load``.
"""
import io
import random

import numpy as np
import torch


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
