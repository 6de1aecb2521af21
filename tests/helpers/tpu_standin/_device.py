"""The stand-in's device module: ``install()`` registers it as ``torch.tpu``.

It offers the part of TorchTPU's ``torch.tpu`` that PyTorch and Lightning reach: devices, seeding and generator
states, synchronization and the dtypes autocast accepts. ``torch.manual_seed`` seeds the device too (through
``manual_seed_all``, as it does for every registered device module).

As TorchTPU's, the functions that ``torch.accelerator`` replaces are internal from torch 2.11 on (the seed and
generator state queries from 2.13): called from outside torch they raise and name the ``torch.accelerator``
function to use, unless ``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1``, which makes them warn once.
"""
import functools
import os
import sys
import warnings
from types import FrameType, TracebackType
from typing import Any, Callable, List, Optional, Tuple, Type, TypeVar, Union

import torch
from packaging.version import Version

from ._build import extension

DEVICE_TYPE = "tpu"
DeviceLike = Union[int, str, torch.device, None]
#: TorchTPU's switch that turns the error of an internal function called from outside torch into a warning
ALLOW_LEGACY_VARIABLE = "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS"
# the callers an internal function serves: torch, TorchTPU, and the stand-in itself
_FRAMEWORK = ("torch", "torch_tpu", __package__)
_TORCH = Version(torch.__version__).release[:2]
_Function = TypeVar("_Function", bound=Callable[..., Any])


def _is_framework(frame: Optional[FrameType]) -> bool:
    module = frame.f_globals.get("__name__", "") if frame is not None else ""
    return any(module == root or module.startswith(f"{root}.") for root in _FRAMEWORK)


def _internal(prefer: str, since: Tuple[int, int] = (2, 11), name: str = "") -> Callable[[_Function], _Function]:
    """Make a function internal from torch ``since`` on, as TorchTPU does: a caller outside torch gets an error
    that names ``prefer`` (a warning, once, with ``TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1``)."""

    def decorate(function: _Function) -> _Function:
        if _TORCH < since:
            return function
        shown_name = name or function.__name__
        warned = False

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            nonlocal warned
            if not _is_framework(sys._getframe(1)):
                message = (
                    f"{shown_name} is internal to TorchTPU and can only be called by the PyTorch framework (torch "
                    f"and torch_tpu). Use {prefer} instead."
                )
                if os.environ.get(ALLOW_LEGACY_VARIABLE) != "1":
                    raise RuntimeError(message)
                if not warned:
                    warnings.warn(message, stacklevel=2)
                    warned = True
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def _index(device: DeviceLike) -> int:
    """The index of ``device``: an index, ``"tpu"``/``"tpu:1"``, a ``torch.device``, or ``None`` for the current."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != DEVICE_TYPE:
            raise ValueError(f"expected a {DEVICE_TYPE!r} device, got {device}")
        index = current_device() if device.index is None else device.index
    if not 0 <= index < device_count():
        raise ValueError(f"{DEVICE_TYPE}:{index} does not exist, there are {device_count()} devices")
    return index


@_internal("torch.accelerator.device_count")
def device_count() -> int:
    """The number of devices of this process (``install(device_count=...)`` or ``TPU_STANDIN_DEVICES``)."""
    return extension().device_count()


@_internal("torch.accelerator.is_available")
def is_available() -> bool:
    """Whether the process has a device: always, once installed."""
    return device_count() > 0


def is_initialized() -> bool:
    """The stand-in has nothing to initialize lazily: once registered, it is ready."""
    return True


def _is_in_bad_fork() -> bool:
    """Host memory survives ``fork``: a forked child can use the stand-in (``torch.manual_seed`` asks this)."""
    return False


@_internal("torch.accelerator.current_device_index")
def current_device() -> int:
    """The index of the calling thread's current device."""
    return extension().current_device()


@_internal("torch.accelerator.set_device_index")
def set_device(device: DeviceLike) -> None:
    """Make ``device`` the current device of the calling thread."""
    extension().set_device(_index(device))


class device:
    """Context manager that makes ``device`` current and restores the previous device on exit."""

    @_internal("torch.accelerator.device_index", name="device")
    def __init__(self, device: DeviceLike) -> None:
        self._index = _index(device)
        self._previous = -1

    def __enter__(self) -> None:
        self._previous = extension().exchange_device(self._index)

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        extension().exchange_device(self._previous)


@_internal("torch.accelerator.synchronize")
def synchronize(device: DeviceLike = None) -> None:
    """Every kernel of the stand-in runs synchronously on the host: nothing to wait for (the device is checked)."""
    _index(device)


@functools.lru_cache(maxsize=1)
def _default_generators() -> Tuple[torch.Generator, ...]:
    """The default generator of each device (the device count is fixed once a generator exists)."""
    return tuple(extension().default_generator(index) for index in range(device_count()))


def __getattr__(name: str) -> Tuple[torch.Generator, ...]:
    # ``torch.tpu.default_generators``, as ``torch.cuda.default_generators``
    if name == "default_generators":
        return _default_generators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def manual_seed(seed: int) -> None:
    """Seed the generator of the current device."""
    _default_generators()[current_device()].manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    """Seed the generators of every device."""
    for generator in _default_generators():
        generator.manual_seed(int(seed))


def seed() -> None:
    """Seed the generator of the current device with a non-deterministic random number."""
    _default_generators()[current_device()].seed()


@_internal("torch.accelerator.random.initial_seed", since=(2, 13))
def initial_seed() -> int:
    """The seed of the current device's generator."""
    return _default_generators()[current_device()].initial_seed()


@_internal("torch.accelerator.random.get_rng_state", since=(2, 13))
def get_rng_state(device: DeviceLike = DEVICE_TYPE) -> torch.Tensor:
    """The state of ``device``'s generator, a CPU ``torch.uint8`` tensor."""
    return _default_generators()[_index(device)].get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = DEVICE_TYPE) -> None:
    """Restore ``device``'s generator to a state that ``get_rng_state`` returned."""
    _default_generators()[_index(device)].set_state(new_state)


def get_amp_supported_dtype() -> List[torch.dtype]:
    """The dtypes ``torch.autocast("tpu", dtype=...)`` accepts."""
    return [torch.bfloat16, torch.float16, torch.float32]
