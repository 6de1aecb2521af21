"""XLA device detection and ``devices`` parsing of Lightning Lite on the PJRT runtime (patches
`compat-pjrt-device-detection-and-environment` and `compat-pjrt-launchers-and-strategies`)."""
import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_env import fake_tpu_host, set_user_pjrt_device
from helpers.xla_subprocess import run_python

pytest.importorskip("torch_xla")

from lightning_lite import LightningLite  # noqa: E402
from lightning_lite.accelerators import tpu as lite_tpu  # noqa: E402
from lightning_lite.accelerators.tpu import TPUAccelerator  # noqa: E402
from lightning_lite.utilities.exceptions import MisconfigurationException  # noqa: E402


@pytest.fixture
def no_tpu_chips(monkeypatch):
    """This host has no TPU chip, whatever the machine the test runs on."""
    fake_tpu_host(monkeypatch, chips=0, libtpu=False)


@pytest.fixture
def four_tpu_chips(monkeypatch):
    """Pretend that the host has four TPU chips (a v4-8) and libtpu, without touching the runtime."""
    set_user_pjrt_device(monkeypatch, None)
    fake_tpu_host(monkeypatch, chips=4)


class _Lite(LightningLite):
    def run(self) -> None:
        pass


class _MissingRequirement:
    """Stands for the ``RequirementCache`` of a package that is not installed."""

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return "Requirement 'torch_xla' not met. HINT: Try running `pip install -U 'torch_xla'`"


def test_available_with_pjrt_cpu(monkeypatch, no_tpu_chips):
    set_user_pjrt_device(monkeypatch, "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    assert TPUAccelerator.is_available()
    assert TPUAccelerator.auto_device_count() == 1
    monkeypatch.setenv("CPU_NUM_DEVICES", "3")
    assert TPUAccelerator.auto_device_count() == 3


def test_not_available_without_pjrt_device_and_chips(monkeypatch, no_tpu_chips):
    set_user_pjrt_device(monkeypatch, None)
    assert not TPUAccelerator.is_available()
    assert TPUAccelerator.auto_device_count() == 0


def test_available_with_tpu_chips(four_tpu_chips):
    assert TPUAccelerator.is_available()
    assert TPUAccelerator.auto_device_count() == 4
    assert TPUAccelerator.parse_devices(4) == 4


def test_detection_does_not_start_the_runtime():
    """``xmp.spawn`` refuses to start once the runtime runs, so detection and building the Trainer must not start
    it; checked in a fresh interpreter since other tests of this worker may have started the runtime."""
    result = run_python(
        """
        import torch_xla
        from lightning_lite.accelerators.tpu import TPUAccelerator
        from lightning_lite.plugins.environments import XLAEnvironment
        import pytorch_lightning as pl
        from pytorch_lightning.strategies import TPUSpawnStrategy

        seen = {"available": TPUAccelerator.is_available(), "auto": TPUAccelerator.auto_device_count()}
        seen["parsed"] = TPUAccelerator.parse_devices(1)
        env = XLAEnvironment()
        seen["ranks"] = [env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()]
        pl.Trainer(accelerator="tpu", devices=1, logger=False)
        pl.Trainer(accelerator="tpu", devices=1, strategy=TPUSpawnStrategy(), logger=False)
        seen["initialized"] = torch_xla._XLAC._xla_runtime_is_initialized()
        emit(seen)
        """,
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": None},
        timeout=120,
    )
    assert result == {"available": True, "auto": 1, "parsed": 1, "ranks": [1, 0, 0, 0], "initialized": False}


def test_unknown_pjrt_device_is_a_clear_error(monkeypatch):
    set_user_pjrt_device(monkeypatch, "QUANTUM")
    # only the TPU accelerator validates PJRT_DEVICE; asking whether it is available never raises
    assert not TPUAccelerator.is_available()
    with pytest.raises(MisconfigurationException, match="PJRT_DEVICE=QUANTUM"):
        _Lite(accelerator="tpu", devices=1)


def test_more_devices_than_exist(monkeypatch, no_tpu_chips):
    set_user_pjrt_device(monkeypatch, "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    with pytest.raises(MisconfigurationException, match="only 1 XLA device"):
        TPUAccelerator.parse_devices(2)
    with pytest.raises(MisconfigurationException, match="does not exist"):
        TPUAccelerator.parse_devices([3])
    with pytest.raises(MisconfigurationException, match="only 1 XLA device"):
        _Lite(accelerator="tpu", devices=8)


def test_device_count_pjrt_cannot_run(four_tpu_chips):
    # PJRT starts one process or one per chip: 2 of 4 chips is impossible
    with pytest.raises(MisconfigurationException, match="`devices=1` or `devices=4`"):
        TPUAccelerator.parse_devices(2)
    with pytest.raises(MisconfigurationException, match="`devices=1` or `devices=4`"):
        _Lite(accelerator="tpu", devices=2)
    assert TPUAccelerator.parse_devices(1) == 1
    assert TPUAccelerator.parse_devices([2]) == [2]


def test_torch_xla_missing_is_a_clear_error(monkeypatch):
    set_user_pjrt_device(monkeypatch, "CPU")
    monkeypatch.setattr(lite_tpu, "_XLA_AVAILABLE", _MissingRequirement())
    assert not TPUAccelerator.is_available()
    with pytest.raises(ModuleNotFoundError, match="Requirement 'torch_xla' not met.*pip install"):
        _Lite(accelerator="tpu", devices=1)


def test_auto_accelerator_ignores_xla_cpu(monkeypatch, no_tpu_chips):
    """``PJRT_DEVICE=CPU`` is opt-in for ``accelerator="tpu"``; ``"auto"`` keeps training on the plain CPU."""
    set_user_pjrt_device(monkeypatch, "CPU")
    lite = _Lite(accelerator="auto", devices=1)
    assert lite.device == torch.device("cpu")


@RunIf(xla=True)
def test_lite_device_is_xla(monkeypatch):
    lite = _Lite(accelerator="tpu", devices=1)
    assert isinstance(lite._accelerator, TPUAccelerator)
    assert lite.device.type == "xla"
