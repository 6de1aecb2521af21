"""Stand-ins for what the user put in the environment and what the host has, for XLA device selection tests.

Lightning reads ``PJRT_DEVICE`` as the user set it before torch_xla was imported (torch_xla sets it itself when it is
imported without it). In a pytest process torch_xla is imported already, so ``monkeypatch.setenv("PJRT_DEVICE", ...)``
no longer counts as the user's choice; these helpers replace the recorded choice instead. Tests of the real thing run
in a fresh interpreter (``helpers.xla_subprocess``).
"""
from typing import Optional

import pytest


def set_user_pjrt_device(monkeypatch: pytest.MonkeyPatch, value: Optional[str]) -> None:
    """Make Lightning see ``PJRT_DEVICE=value`` as set by the user before torch_xla was imported (``None``: unset)."""
    from lightning_lite.accelerators import tpu as lite_tpu

    monkeypatch.setattr(lite_tpu, "_user_pjrt_device", lambda: value)


def fake_tpu_host(monkeypatch: pytest.MonkeyPatch, chips: int, libtpu: bool = True) -> None:
    """Pretend that the host has ``chips`` TPU chips and, with ``libtpu``, the TPU runtime to drive them."""
    from torch_xla._internal import tpu

    from lightning_lite.accelerators import tpu as lite_tpu

    monkeypatch.setattr(tpu, "num_available_chips", lambda: chips)
    monkeypatch.setattr(lite_tpu, "_libtpu_found", lambda: libtpu)
