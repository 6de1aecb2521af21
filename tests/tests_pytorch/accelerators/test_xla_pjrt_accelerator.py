"""``Trainer(accelerator="tpu")`` on one XLA device with the PJRT runtime (patches
`compat-pjrt-device-detection-and-environment` and `compat-pjrt-launchers-and-strategies`)."""
import pytest
import torch
from torch import nn

from helpers.runif import RunIf
from helpers.xla_classifier import ClassifierModule, classifier_loader, xla_trainer
from helpers.xla_env import fake_tpu_host, set_user_pjrt_device

pytest.importorskip("torch_xla")

import pytorch_lightning as pl  # noqa: E402
from lightning_lite.accelerators import tpu as lite_tpu  # noqa: E402
from pytorch_lightning.accelerators import TPUAccelerator  # noqa: E402
from pytorch_lightning.strategies import SingleTPUStrategy  # noqa: E402
from pytorch_lightning.utilities.exceptions import MisconfigurationException  # noqa: E402


def _cpu_state(module: nn.Module) -> dict:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


@RunIf(xla=True)
def test_fit_validate_test_predict_on_one_xla_device(tmp_path):
    torch.manual_seed(0)
    model = ClassifierModule()
    initial = _cpu_state(model)
    trainer = xla_trainer(tmp_path, max_epochs=2, limit_val_batches=2)
    assert isinstance(trainer.strategy, SingleTPUStrategy)
    assert isinstance(trainer.accelerator, TPUAccelerator)

    trainer.fit(model, classifier_loader(), classifier_loader(32))
    assert trainer.global_step == 8
    assert model.seen["train"] == {"xla"} and model.seen["val"] == {"xla"}
    trained = _cpu_state(model)
    assert all(not torch.equal(initial[k], trained[k]) for k in initial)

    val = trainer.validate(model, classifier_loader(32))
    test = trainer.test(model, classifier_loader(32))
    assert model.seen["test"] == {"xla"}
    assert val[0]["val_loss"] == pytest.approx(test[0]["test_loss"])
    # trained on a learnable rule: better than chance (ln 4 = 1.39)
    assert test[0]["test_loss"] < 1.2

    predictions = trainer.predict(model, classifier_loader(32))
    assert model.seen["predict"] == {"xla"}
    assert len(predictions) == 2 and all(p.shape == (16,) for p in predictions)


@RunIf(xla=True)
def test_checkpoint_resume_continues_with_identical_weights(tmp_path):
    """Two epochs in one go equal one epoch, a checkpoint, and one more epoch in a new Trainer (1.8.6 restarts an
    epoch that a checkpoint interrupted, so the checkpoint is taken at the end of an epoch)."""
    torch.manual_seed(0)
    straight = ClassifierModule()
    start = _cpu_state(straight)
    xla_trainer(tmp_path / "straight", max_epochs=2).fit(straight, classifier_loader())

    first = ClassifierModule()
    first.load_state_dict(start)
    trainer = xla_trainer(tmp_path / "first", max_epochs=1)
    trainer.fit(first, classifier_loader())
    ckpt = tmp_path / "half.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert all(t.device.type == "cpu" for t in saved["state_dict"].values())
    assert all(torch.equal(saved["state_dict"][k], v) for k, v in _cpu_state(first).items())

    resumed = ClassifierModule()
    trainer = xla_trainer(tmp_path / "resumed", max_epochs=2)
    trainer.fit(resumed, classifier_loader(), ckpt_path=str(ckpt))
    assert trainer.global_step == 8
    expected, got = _cpu_state(straight), _cpu_state(resumed)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=1e-5, atol=1e-6)
    assert not torch.equal(got["net.0.weight"], saved["state_dict"]["net.0.weight"])


@RunIf(xla=True)
def test_device_stats_on_xla_cpu_are_empty_not_an_error():
    import torch_xla

    assert TPUAccelerator().get_device_stats(torch_xla.device()) == {}


def test_device_stats_read_the_torch_xla_2_memory_keys(monkeypatch):
    import torch_xla.core.xla_model as xm

    mb = 1024**2
    info = {"bytes_used": 2 * mb, "bytes_limit": 10 * mb, "peak_bytes_used": 3 * mb}
    monkeypatch.setattr(xm, "get_memory_info", lambda device=None: info)
    stats = TPUAccelerator().get_device_stats(torch.device("xla", 0))
    assert stats == {"avg. free memory (MB)": 8.0, "avg. peak memory (MB)": 3.0}


def test_trainer_rejects_more_devices_than_exist(monkeypatch, tmp_path):
    fake_tpu_host(monkeypatch, chips=0, libtpu=False)
    set_user_pjrt_device(monkeypatch, "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    with pytest.raises(MisconfigurationException, match="only 1 XLA device"):
        xla_trainer(tmp_path, devices=8)


def test_trainer_rejects_device_count_pjrt_cannot_run(monkeypatch, tmp_path):
    set_user_pjrt_device(monkeypatch, None)
    fake_tpu_host(monkeypatch, chips=4)
    with pytest.raises(MisconfigurationException, match="`devices=1` or `devices=4`"):
        xla_trainer(tmp_path, devices=2)


def test_trainer_unknown_pjrt_device(monkeypatch, tmp_path):
    set_user_pjrt_device(monkeypatch, "GPU_TYPO")
    with pytest.raises(MisconfigurationException, match="PJRT_DEVICE=GPU_TYPO"):
        xla_trainer(tmp_path)


def test_trainer_without_torch_xla(monkeypatch, tmp_path):
    class _Missing:
        def __bool__(self):
            return False

        def __str__(self):
            return "Requirement 'torch_xla' not met. HINT: Try running `pip install -U 'torch_xla'`"

    import pytorch_lightning.accelerators.tpu as pl_tpu

    set_user_pjrt_device(monkeypatch, "CPU")
    monkeypatch.setattr(lite_tpu, "_XLA_AVAILABLE", _Missing())
    monkeypatch.setattr(pl_tpu, "_XLA_AVAILABLE", _Missing())
    assert not TPUAccelerator.is_available()
    with pytest.raises(ModuleNotFoundError, match="Requirement 'torch_xla' not met.*pip install"):
        xla_trainer(tmp_path)


class _RecordingLogger(pl.loggers.CSVLogger):
    """A CSV logger that keeps the names of every metric it was given."""

    def __init__(self, save_dir) -> None:
        super().__init__(save_dir)
        self.names = set()

    def log_metrics(self, metrics, step=None) -> None:
        self.names.update(metrics)
        super().log_metrics(metrics, step)


@RunIf(xla=True)
@pytest.mark.parametrize("cpu_stats", [None, False])
def test_device_stats_monitor_says_when_xla_reports_nothing(tmp_path, cpu_stats):
    """XLA's CPU device has no memory statistics: the monitor warns once that it has nothing to log for it (with a
    hint at ``cpu_stats=True`` unless the user chose ``cpu_stats`` already) and logs nothing for the device."""
    from pytorch_lightning.callbacks import DeviceStatsMonitor

    logger = _RecordingLogger(tmp_path)
    trainer = xla_trainer(tmp_path, callbacks=[DeviceStatsMonitor(cpu_stats=cpu_stats)], logger=logger,
                       log_every_n_steps=1, limit_val_batches=0, max_epochs=1)
    with pytest.warns(UserWarning, match=r"has no stats to log for the xla device") as record:
        trainer.fit(ClassifierModule(), classifier_loader())
    said = [w for w in record if "has no stats to log" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in said]
    assert ("cpu_stats=True" in str(said[0].message)) is (cpu_stats is None)
    assert trainer.global_step == 4
    assert not {n for n in logger.names if n.startswith("DeviceStatsMonitor.")}, sorted(logger.names)
