"""``TPUSpawnStrategy`` and the Trainer's XLA launcher on the PJRT runtime (patch
`compat-pjrt-launchers-and-strategies`)."""
import os
import queue

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

pytest.importorskip("torch_xla")

import torch_xla  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

from lightning_lite.plugins.environments import xla as xla_env_module  # noqa: E402
from lightning_lite.strategies.launchers import xla as lite_launcher_module  # noqa: E402
from pytorch_lightning.strategies import TPUSpawnStrategy  # noqa: E402
from pytorch_lightning.strategies.launchers import xla as launcher_module  # noqa: E402
from pytorch_lightning.strategies.launchers.xla import _XLALauncher  # noqa: E402
from pytorch_lightning.utilities.exceptions import MisconfigurationException  # noqa: E402

TESTS_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _strategy(num_devices: int) -> TPUSpawnStrategy:
    return TPUSpawnStrategy(parallel_devices=[torch.device("xla", i) for i in range(num_devices)])


@pytest.fixture
def mocked_spawn(monkeypatch):
    """``xmp.spawn`` recorded and run in-process, with the runtime queries mocked (no runtime start, no rendezvous),
    on a TPU host (on XLA's CPU device, several processes are refused)."""
    import torch_xla.distributed.xla_multiprocessing as xmp

    calls = []

    def spawn(fn, args=(), nprocs=None, start_method="spawn", **kwargs):
        calls.append({"nprocs": nprocs, "start_method": start_method})
        fn(0, *args)

    monkeypatch.setattr(xmp, "spawn", spawn)
    monkeypatch.setattr(xr, "local_ordinal", lambda: 0)
    monkeypatch.setattr(launcher_module, "_rank_teardown", lambda rank: None)
    monkeypatch.setattr(torch_xla._XLAC, "_xla_runtime_is_initialized", lambda: False)
    monkeypatch.setattr(lite_launcher_module, "_pjrt_device", lambda: "TPU")
    return calls


@pytest.mark.parametrize("devices_on_host, num_processes, expected", [(4, 4, None), (4, 1, 1), (1, 1, None)])
def test_launcher_passes_what_pjrt_accepts(monkeypatch, mocked_spawn, devices_on_host, num_processes, expected):
    monkeypatch.setattr(lite_launcher_module, "_xla_device_count", lambda: devices_on_host)
    launcher = _XLALauncher(_strategy(num_processes))
    assert launcher.launch(lambda x: x * 2, 21) == 42
    assert mocked_spawn == [{"nprocs": expected, "start_method": "fork"}]


def test_launcher_rejects_counts_pjrt_cannot_start(monkeypatch, mocked_spawn):
    monkeypatch.setattr(lite_launcher_module, "_xla_device_count", lambda: 8)
    with pytest.raises(MisconfigurationException, match="Cannot launch 4 processes.*`devices=8`"):
        _XLALauncher(_strategy(4)).launch(lambda: None)
    assert mocked_spawn == []


def test_wrapping_function_uses_the_local_ordinal(monkeypatch):
    """PJRT passes the global ordinal (9 on the second host of a pod); the local rank must come from the runtime, and
    the first process of every host hands back a result so that every host's main process returns."""
    teardowns = []
    monkeypatch.setattr(launcher_module, "_rank_teardown", teardowns.append)
    strategy = _strategy(8)
    launcher = _XLALauncher(strategy)
    results = queue.Queue()

    monkeypatch.setattr(xr, "local_ordinal", lambda: 1)
    launcher._wrapping_function(9, None, lambda: "global 9", (), {}, results)
    assert strategy.local_rank == 1 and results.empty()

    monkeypatch.setattr(xr, "local_ordinal", lambda: 0)
    launcher._wrapping_function(8, None, lambda: "global 8", (), {}, results)
    assert strategy.local_rank == 0 and results.get_nowait() == "global 8"
    assert teardowns == [9, 8]


def test_is_distributed_without_removed_env_vars(monkeypatch):
    strategy = _strategy(4)
    monkeypatch.setattr(xla_env_module, "_xla_runtime_started", lambda: True)
    monkeypatch.setattr(xr, "world_size", lambda: 4)
    assert not strategy.is_distributed
    strategy._launched = True
    assert strategy.is_distributed
    monkeypatch.setattr(xr, "world_size", lambda: 1)
    assert not strategy.is_distributed


def test_broadcast_and_barrier_outside_a_launched_world_need_no_collective(monkeypatch):
    import torch_xla.core.xla_model as xm

    def collective(*args, **kwargs):
        raise AssertionError("a collective outside the spawned processes")

    monkeypatch.setattr(xm, "rendezvous", collective)
    monkeypatch.setattr(xm, "all_gather", collective)
    strategy = _strategy(4)
    strategy.barrier("setup")
    assert strategy.broadcast({"path": "/tmp/x"}) == {"path": "/tmp/x"}


@RunIf(xla=True)
def test_process_dataloader_keeps_the_dataloader():
    """The loops copy the batches on a loader thread of their own: ``tpu_spawn`` hands them the dataloader itself,
    not a torch_xla ``MpDeviceLoader`` (one nested in another syncs the graph from its thread, which torch_xla 2.x
    rejects; the prediction loop does not process the processed dataloader again)."""
    from torch.utils.data import DataLoader

    strategy = _strategy(1)
    strategy._launched = True
    loader = DataLoader(list(range(8)), batch_size=4)
    assert strategy.process_dataloader(loader) is loader
    assert strategy._copies_batches_ahead


def test_spawn_strategy_trains_in_a_spawned_process(tmp_path):
    """The whole launcher path for real, in a fresh interpreter: PJRT forks one worker (one XLA:CPU device), which
    fits, validates and predicts; the weights and metrics come back to the main process, which saves a checkpoint
    of them, and the main
    process never starts the runtime (so it can launch again for each stage)."""
    out = run_python(
        f"""
        import os, sys, torch
        sys.path.insert(0, {TESTS_ROOT!r})
        import torch_xla
        import pytorch_lightning as pl
        from pytorch_lightning.strategies import TPUSpawnStrategy
        from helpers.xla_classifier import ClassifierModule, classifier_loader, xla_trainer

        class Module(ClassifierModule):
            def on_predict_epoch_start(self):
                self.predicted = 0

            def predict_step(self, batch, batch_idx, dataloader_idx=0):
                self.predicted += 1
                return super().predict_step(batch, batch_idx, dataloader_idx)

            def on_predict_epoch_end(self, results):
                with open(os.path.join({str(tmp_path)!r}, "predicted"), "w") as f:
                    f.write(str(self.predicted) + " " + str(os.getpid()))

        torch.manual_seed(0)
        model = Module()
        before = {{k: v.clone() for k, v in model.state_dict().items()}}
        trainer = xla_trainer({str(tmp_path)!r}, max_epochs=1, strategy=TPUSpawnStrategy(), limit_val_batches=1)
        trainer.fit(model, classifier_loader(), classifier_loader(16))
        changed = [not torch.equal(before[k], v) for k, v in model.state_dict().items()]
        metrics = trainer.validate(model, classifier_loader(32))
        trainer.predict(model, classifier_loader(48), return_predictions=False)
        trainer.save_checkpoint(os.path.join({str(tmp_path)!r}, "main.ckpt"))
        emit({{
            "changed": changed,
            "val_loss": metrics[0]["val_loss"],
            "weight_sum": float(model.state_dict()["net.0.weight"].abs().sum()),
            "main_pid": os.getpid(),
            "main_runtime_started": torch_xla._XLAC._xla_runtime_is_initialized(),
        }})
        """,
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": None},
        timeout=300,
    )
    assert out["main_runtime_started"] is False
    assert all(out["changed"])
    assert 0 < out["val_loss"] < 1.39
    predicted, pid = (tmp_path / "predicted").read_text().split()
    # 48 samples in batches of 16 ran through the (single) device loader, in the spawned worker
    assert predicted == "3" and int(pid) != out["main_pid"]
    # the main process saves the weights that came back from the worker, without starting the runtime
    ckpt = torch.load(tmp_path / "main.ckpt", map_location="cpu", weights_only=False)
    assert float(ckpt["state_dict"]["net.0.weight"].abs().sum()) == pytest.approx(out["weight_sum"])


@RunIf(tpu=True)
def test_spawn_strategy_on_all_tpu_devices(tmp_path):
    """One process per chip with real collectives (reduce, broadcast, barrier, final rendezvous)."""
    out = run_python(
        f"""
        import sys, torch
        sys.path.insert(0, {TESTS_ROOT!r})
        from helpers.xla_classifier import ClassifierModule, classifier_loader, xla_trainer
        from pytorch_lightning.accelerators import TPUAccelerator

        model = ClassifierModule()
        trainer = xla_trainer({str(tmp_path)!r}, devices="auto", max_epochs=1, limit_val_batches=1)
        trainer.fit(model, classifier_loader(), classifier_loader(16))
        emit({{"devices": TPUAccelerator.auto_device_count(), "processes": trainer.strategy.num_processes,
               "val_loss": float(trainer.callback_metrics["val_loss"])}})
        """,
        env={"PJRT_DEVICE": "TPU"},
        timeout=900,
    )
    assert out["processes"] == out["devices"] > 1
    assert out["val_loss"] < 1.39
