"""``RunIf``: skip a test unless the environment provides what it needs, in the style of upstream Lightning's helper.

Marks:
    xla: a working XLA device. CI provides one on the CPU with ``PJRT_DEVICE=CPU``; a TPU VM with ``PJRT_DEVICE=TPU``.
    tpu: real TPU hardware, or several replicas that talk to each other (collectives hang on XLA:CPU).
    standalone: the test must run in its own process; it runs only with ``PL_RUN_STANDALONE_TESTS=1``.

None of the checks starts the XLA runtime, so a test that spawns processes with ``xmp.spawn`` still can.
"""
import functools
import importlib.util
import os
from typing import Optional

import pytest


@functools.lru_cache(maxsize=1)
def _torch_xla_importable() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


@functools.lru_cache(maxsize=1)
def tpu_chip_count() -> int:
    """TPU chips on this host, counted from the PCI bus without starting the runtime."""
    if not _torch_xla_importable():
        return 0
    try:
        from torch_xla._internal import tpu

        return int(tpu.num_available_chips())
    except Exception:
        return 0


def xla_device_reason() -> Optional[str]:
    """Why no XLA device is usable here, or ``None`` when one is."""
    if not _torch_xla_importable():
        return "torch_xla is not installed"
    # the user's choice, not a value torch_xla set for itself when something imported it without one
    from lightning_lite.accelerators.tpu import _user_pjrt_device

    device = _user_pjrt_device() or ""
    if device.upper() == "TPU" or (not device and tpu_chip_count() > 0):
        return None if tpu_chip_count() > 0 else "PJRT_DEVICE=TPU but this host has no TPU chip"
    if device.upper() in ("CPU", "CUDA"):
        return None
    return "no XLA device: set PJRT_DEVICE=CPU for XLA on the CPU, or run on a TPU VM"


def tpu_reason() -> Optional[str]:
    if not _torch_xla_importable():
        return "torch_xla is not installed"
    if tpu_chip_count() == 0:
        return "needs real TPU hardware (collectives between replicas hang on XLA:CPU); runs on the Cloud TPU VM workflow"
    return None


def torch_tpu_reason() -> Optional[str]:
    """Why TorchTPU's tests cannot run here, or None: they need torch 2.11 or newer (the stand-in's floor and
    torch-tpu's), which the torchtpu stack has (``make test STACK=torchtpu``)."""
    import torch
    from packaging.version import Version

    if Version(torch.__version__).release[:2] < (2, 11):
        return f"needs torch >= 2.11 for TorchTPU's 'tpu' device (this is {torch.__version__}): make test STACK=torchtpu"
    return None


class RunIf:
    """``@RunIf(xla=True)`` and friends: apply the matching mark and skip with the reason when unmet.

    Args:
        xla: the test needs an XLA device, a TPU or XLA on the CPU (``PJRT_DEVICE=CPU``); marked ``xla``.
        tpu: the test needs TPU hardware (collectives between replicas, libtpu); marked ``tpu`` and run in the
            Cloud TPU VM workflow.
        standalone: the test must run in a process of its own; marked ``standalone`` and skipped unless
            ``PL_RUN_STANDALONE_TESTS=1``.
        min_torch_xla: the lowest torch_xla version the test works with, e.g. ``"2.9"``; skipped below it, and when
            torch_xla is not installed.
        torch_tpu: the test trains on TorchTPU's ``"tpu"`` device: the stand-in of ``helpers.tpu_standin`` (torch 2.11
            or newer, ``make test STACK=torchtpu``), or the real ``torch-tpu`` on a TPU VM (``PL_TORCH_TPU_REAL=1``);
            marked ``tpu_standin``.

    Example::

        @RunIf(xla=True)
        def test_one_graph_per_step(tmp_path): ...
    """

    def __new__(cls, xla: bool = False, tpu: bool = False, standalone: bool = False, min_torch_xla: str = "",
                torch_tpu: bool = False):
        marks = []
        reasons = []
        if xla:
            marks.append(pytest.mark.xla)
            reason = xla_device_reason()
            if reason:
                reasons.append(reason)
        if tpu:
            marks.append(pytest.mark.tpu)
            reason = tpu_reason()
            if reason:
                reasons.append(reason)
        if standalone:
            marks.append(pytest.mark.standalone)
            if os.getenv("PL_RUN_STANDALONE_TESTS", "0") != "1":
                reasons.append("standalone test: set PL_RUN_STANDALONE_TESTS=1")
        if torch_tpu:
            marks.append(pytest.mark.tpu_standin)
            reason = torch_tpu_reason()
            if reason:
                reasons.append(reason)
        if min_torch_xla:
            from packaging.version import Version

            try:
                import importlib.metadata as md

                if Version(md.version("torch_xla")) < Version(min_torch_xla):
                    reasons.append(f"needs torch_xla>={min_torch_xla}")
            except Exception:
                reasons.append(f"needs torch_xla>={min_torch_xla}")

        def decorate(fn):
            for mark in marks:
                fn = mark(fn)
            return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons))(fn)

        return decorate
