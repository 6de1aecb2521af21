"""Lightning Lite's XLA strategies, launcher and cluster environment on the PJRT runtime (patch
`compat-pjrt-launchers-and-strategies`)."""
import os
import queue

import pytest
import torch

from helpers.lite_training_loop import TrainingLoop
from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

pytest.importorskip("torch_xla")

import torch_xla  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

from lightning_lite.plugins.environments import XLAEnvironment  # noqa: E402
from lightning_lite.plugins.environments import xla as xla_env_module  # noqa: E402
from lightning_lite.strategies import SingleTPUStrategy, XLAStrategy  # noqa: E402
from lightning_lite.strategies.launchers import xla as launcher_module  # noqa: E402
from lightning_lite.strategies.launchers.xla import _XLALauncher  # noqa: E402
from lightning_lite.utilities.exceptions import MisconfigurationException  # noqa: E402


@RunIf(xla=True)
def test_lite_trains_on_one_xla_device():
    lite = TrainingLoop(accelerator="tpu", devices=1)
    assert isinstance(lite._strategy, SingleTPUStrategy)
    out = lite.run()
    assert out["param_devices"] == ["xla"]
    # the optimizer steps the parameters on the device, not the CPU copies it was built with
    assert out["optimizer_param_devices"] == ["xla"]
    assert out["input_device"] == "xla"
    assert all(out["changed"])
    # same batch each step: SGD must lower the loss
    assert out["losses"][-1] < out["losses"][0]


def test_xla_launcher_spawns_one_process_per_device_in_a_fresh_process():
    """The whole ``XLAStrategy`` path for real: PJRT spawns a worker (one per device, one XLA:CPU device here), the
    worker trains and its result comes back to the main process, which never starts the runtime itself."""
    out = run_python(
        """
        import os, sys
        sys.path.insert(0, {tests!r})
        import torch_xla
        from helpers.lite_training_loop import TrainingLoop
        from lightning_lite.strategies import XLAStrategy

        lite = TrainingLoop(accelerator="tpu", devices=1, strategy="xla")
        assert isinstance(lite._strategy, XLAStrategy), lite._strategy
        result = lite.run()
        result["main_pid"] = os.getpid()
        result["main_runtime_started"] = torch_xla._XLAC._xla_runtime_is_initialized()
        emit(result)
        """.format(tests=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": None},
        timeout=180,
    )
    assert out["pid"] != out["main_pid"], "the function must run in the spawned process"
    assert out["main_runtime_started"] is False
    assert out["param_devices"] == ["xla"]
    assert all(out["changed"])


class _SpawnRecorder:
    def __init__(self, process_index: int = 0):
        self.calls = []
        self.process_index = process_index

    def __call__(self, fn, args=(), nprocs=None, start_method="spawn", **kwargs):
        self.calls.append({"nprocs": nprocs, "start_method": start_method})
        fn(self.process_index, *args)


@pytest.fixture
def mocked_runtime(monkeypatch):
    """``xmp.spawn`` and the runtime queries mocked: nothing starts the XLA runtime or needs collectives. The host is
    a TPU host (on XLA's CPU device, several processes are refused)."""
    import torch_xla.distributed.xla_multiprocessing as xmp

    spawn = _SpawnRecorder()
    teardowns = []
    monkeypatch.setattr(xmp, "spawn", spawn)
    monkeypatch.setattr(xr, "local_ordinal", lambda: 0)
    monkeypatch.setattr(launcher_module, "_rank_teardown", teardowns.append)
    monkeypatch.setattr(torch_xla._XLAC, "_xla_runtime_is_initialized", lambda: False)
    monkeypatch.setattr(launcher_module, "_pjrt_device", lambda: "TPU")
    spawn.teardowns = teardowns
    return spawn


def _strategy(num_devices: int) -> XLAStrategy:
    return XLAStrategy(parallel_devices=[torch.device("xla", i) for i in range(num_devices)])


@pytest.mark.parametrize(
    "devices_on_host, num_processes, expected", [(4, 4, None), (8, 8, None), (4, 1, 1), (1, 1, None)]
)
def test_launcher_passes_what_pjrt_accepts(monkeypatch, mocked_runtime, devices_on_host, num_processes, expected):
    monkeypatch.setattr(launcher_module, "_xla_device_count", lambda: devices_on_host)
    launcher = _XLALauncher(_strategy(num_processes))
    assert launcher.launch(lambda a, b=0: a + b, 2, b=3) == 5
    assert mocked_runtime.calls == [{"nprocs": expected, "start_method": "fork"}]
    assert mocked_runtime.teardowns == [0]


def test_launcher_rejects_counts_pjrt_cannot_start(monkeypatch, mocked_runtime):
    monkeypatch.setattr(launcher_module, "_xla_device_count", lambda: 4)
    launcher = _XLALauncher(_strategy(2))
    with pytest.raises(MisconfigurationException, match="either one process or one per XLA device.*`devices=4`"):
        launcher.launch(lambda: None)
    assert mocked_runtime.calls == []


def test_launcher_refuses_when_runtime_already_started(monkeypatch, mocked_runtime):
    monkeypatch.setattr(launcher_module, "_xla_device_count", lambda: 4)
    monkeypatch.setattr(torch_xla._XLAC, "_xla_runtime_is_initialized", lambda: True)
    with pytest.raises(MisconfigurationException, match="already started"):
        _XLALauncher(_strategy(4)).launch(lambda: None)
    assert mocked_runtime.calls == []


@pytest.mark.parametrize("per_chip, refused", [(2, True), (1, False), (EnvironmentError("no metadata"), False)])
def test_launcher_refuses_all_devices_of_a_two_device_per_chip_tpu(monkeypatch, mocked_runtime, per_chip, refused):
    """TPU v2/v3 chips hold two devices, which PJRT serves with threads inside one process per chip: Lightning's one
    process per device cannot run there. When the TPU generation cannot be read, the launch goes ahead."""
    from torch_xla._internal import tpu

    def devices_per_chip():
        if isinstance(per_chip, Exception):
            raise per_chip
        return per_chip

    monkeypatch.setattr(launcher_module, "_xla_device_count", lambda: 4)
    monkeypatch.setattr(launcher_module, "_pjrt_device", lambda: "TPU")
    monkeypatch.setattr(tpu, "num_logical_cores_per_chip", devices_per_chip)
    launcher = _XLALauncher(_strategy(4))
    if refused:
        with pytest.raises(MisconfigurationException, match="two devices each.*`devices=1`"):
            launcher.launch(lambda: None)
        assert mocked_runtime.calls == []
    else:
        launcher.launch(lambda: None)
        assert mocked_runtime.calls == [{"nprocs": None, "start_method": "fork"}]


def test_wrapping_function_takes_the_local_rank_from_the_runtime(monkeypatch):
    """On a pod, PJRT passes the global ordinal; the rank on the host comes from ``xr.local_ordinal()``, and only the
    first process of each host returns the result."""
    teardowns = []
    monkeypatch.setattr(launcher_module, "_rank_teardown", teardowns.append)
    strategy = _strategy(4)
    launcher = _XLALauncher(strategy)
    results = queue.Queue()

    monkeypatch.setattr(xr, "local_ordinal", lambda: 1)
    launcher._wrapping_function(5, lambda: "from global 5", (), {}, results)
    assert strategy.local_rank == 1
    assert results.empty()

    monkeypatch.setattr(xr, "local_ordinal", lambda: 0)
    launcher._wrapping_function(4, lambda: torch.tensor([1.0]), (), {}, results)
    assert strategy.local_rank == 0
    assert results.get_nowait().device.type == "cpu"
    assert teardowns == [5, 4]


def test_is_distributed_only_in_launched_processes_of_a_larger_world(monkeypatch):
    strategy = _strategy(4)
    monkeypatch.setattr(xla_env_module, "_xla_runtime_started", lambda: True)
    monkeypatch.setattr(xr, "world_size", lambda: 4)
    assert not strategy.is_distributed  # the main process, before spawning
    strategy._launched = True
    assert strategy.is_distributed
    monkeypatch.setattr(xr, "world_size", lambda: 1)
    assert not strategy.is_distributed


def test_xla_environment_reads_the_runtime(monkeypatch):
    monkeypatch.setattr(xla_env_module, "_xla_runtime_started", lambda: True)
    monkeypatch.setattr(xr, "world_size", lambda: 16)
    monkeypatch.setattr(xr, "global_ordinal", lambda: 13)
    monkeypatch.setattr(xr, "local_ordinal", lambda: 1)
    monkeypatch.setattr(xr, "host_index", lambda: 3)
    env = XLAEnvironment()
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (16, 13, 1, 3)


def test_xla_environment_does_not_start_the_runtime(monkeypatch):
    def started_the_runtime():
        raise AssertionError("asked the runtime, which starts it")

    monkeypatch.setattr(xla_env_module, "_xla_runtime_started", lambda: False)
    for name in ("world_size", "global_ordinal", "local_ordinal"):
        monkeypatch.setattr(xr, name, started_the_runtime)
    env = XLAEnvironment()
    assert (env.world_size(), env.global_rank(), env.local_rank()) == (1, 0, 0)


@RunIf(tpu=True)
def test_lite_trains_on_all_tpu_devices():
    """All chips of the host, one process each; needs real collectives."""
    out = run_python(
        """
        import os, sys
        sys.path.insert(0, {tests!r})
        from helpers.lite_training_loop import TrainingLoop
        from lightning_lite.accelerators.tpu import TPUAccelerator

        lite = TrainingLoop(accelerator="tpu", devices="auto")
        result = lite.run()
        result["devices"] = TPUAccelerator.auto_device_count()
        result["world_size"] = lite.world_size
        emit(result)
        """.format(tests=os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
        env={"PJRT_DEVICE": "TPU"},
        timeout=600,
    )
    assert out["param_devices"] == ["xla"]
    assert all(out["changed"])
