"""A stand-in for TorchTPU's ``"tpu"`` device on a machine without a TPU (README.md beside this file).

TorchTPU (``torch-tpu``) is PyTorch's PrivateUse1 backend renamed ``"tpu"``, with a device module ``torch.tpu``
and a ``torch.distributed`` backend ``"tpu"``; without a chip it registers no device. ``install()`` registers a
device of the same kind whose memory is the host's and whose operators run on the CPU, so that code meets a real
out-of-tree device type: ``.to("tpu")``, ``device.type == "tpu"``, ``torch.autocast("tpu")``, ``torch.load``'s
``map_location``, the device's own random generators, and DDP over the ``"tpu"`` backend.

The installed ``torch-tpu`` loads itself at ``import torch`` (torch's ``torch.backends`` entry points): a process
that uses the stand-in sets ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` in its environment before it imports torch.

Example::

    # TORCH_DEVICE_BACKEND_AUTOLOAD=0 python ...
    import torch
    from helpers.tpu_standin import install

    install(device_count=2)
    x = torch.randn(3, device="tpu")
"""
import os
import sys
import threading
from typing import Optional

import torch
from packaging.version import Version

from . import _device
from ._build import extension
from ._device import DEVICE_TYPE

#: the lowest torch with a ``torch-tpu`` release, and the stand-in's floor
MIN_TORCH = "2.11"
#: the environment variable with the device count when ``install`` is given none
DEVICES_VARIABLE = "TPU_STANDIN_DEVICES"

_lock = threading.Lock()
_installed_count: Optional[int] = None


def install(device_count: Optional[int] = None) -> None:
    """Register the stand-in device ``"tpu"`` in this process: idempotent.

    Builds the C++ extension the first time on this machine (cached in ``.cache/tpu_standin``), loads it,
    renames PrivateUse1 to ``"tpu"``, registers ``torch.tpu``, generates ``Tensor.tpu()``/``Tensor.is_tpu`` and
    ``Module.tpu()``, and registers the ``torch.distributed`` backend ``"tpu"``.

    Args:
        device_count: how many devices the process sees; default: ``$TPU_STANDIN_DEVICES``, else 1.

    Raises:
        ValueError: the device count is not in [1, 64].
        RuntimeError: torch is older than 2.11, TorchTPU (or another PrivateUse1 backend) is already loaded in
            this process, or the stand-in was installed with another device count.
    """
    global _installed_count
    count = _device_count(device_count)
    with _lock:
        if _installed_count is not None:
            if count != _installed_count:
                raise RuntimeError(
                    f"the tpu stand-in is installed with {_installed_count} devices, cannot install {count}"
                )
            return
        _check_can_install()
        extension().set_device_count(count)
        torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
        torch._register_device_module(DEVICE_TYPE, _device)
        torch.utils.generate_methods_for_privateuse1_backend()
        if torch.distributed.is_available():
            from . import _distributed

            _distributed.register()
        _installed_count = count


def is_installed() -> bool:
    """Whether ``install()`` registered the stand-in in this process."""
    return _installed_count is not None


def _device_count(requested: Optional[int]) -> int:
    if requested is None:
        value = os.environ.get(DEVICES_VARIABLE, "1")
        try:
            requested = int(value)
        except ValueError:
            raise ValueError(f"{DEVICES_VARIABLE}={value!r} is not a device count") from None
    if not 1 <= requested <= 64:
        raise ValueError(f"the tpu stand-in has 1 to 64 devices, not {requested}")
    return requested


def _check_can_install() -> None:
    if Version(torch.__version__).release[:2] < Version(MIN_TORCH).release:
        raise RuntimeError(
            f"the tpu stand-in needs torch >= {MIN_TORCH} (TorchTPU's floor), this is torch {torch.__version__}"
        )
    if hasattr(torch, DEVICE_TYPE) or f"torch.{DEVICE_TYPE}" in sys.modules:
        raise RuntimeError(
            f"torch.{DEVICE_TYPE} already exists: the real torch-tpu was loaded when torch was imported (its "
            "`torch.backends` entry point). To use the stand-in, set TORCH_DEVICE_BACKEND_AUTOLOAD=0 in the "
            "environment before Python imports torch; on a TPU VM, do not install the stand-in: torch.tpu is the "
            "real device."
        )
    backend = torch._C._get_privateuse1_backend_name()
    if backend != "privateuseone":
        raise RuntimeError(
            f"PrivateUse1 is already renamed {backend!r}: another out-of-tree backend is loaded (a real "
            "torch-tpu, or torch_openreg). Start the process with TORCH_DEVICE_BACKEND_AUTOLOAD=0 and without "
            "importing that backend to use the tpu stand-in."
        )
