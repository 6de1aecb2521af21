"""How many processes Lightning starts on an XLA host, and on which device a single-device run trains.

- ``PJRT_DEVICE=CPU CPU_NUM_DEVICES=2`` with ``devices=2``: PJRT would run the two "ranks" as threads of one process;
  the launcher refuses, naming ``CPU_NUM_DEVICES`` (it failed with ``KeyError: 'tpu_spawn' not found in registry``).
- ``TPU_VISIBLE_CHIPS`` / ``TPU_PROCESS_BOUNDS`` restrict the chips PJRT starts processes for; Lightning counts them
  as torch_xla does (it counted the chips on the PCI bus).
- ``devices=[1]`` on a host with 2 XLA devices: the barriers cut the graph of the default device only, so the run's
  device becomes the default one (before: a bigger graph compiled every step).
"""
import os

import pytest

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python
from lightning_lite.accelerators import tpu as tpu_accelerator
from pytorch_lightning.utilities.exceptions import MisconfigurationException

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# compat patches `compat-pjrt-device-detection-and-environment` (chip restrictions) and
# `compat-pjrt-launchers-and-strategies` (launch on XLA:CPU, default device); their tests name no FIXED_BY


@RunIf(xla=True)
def test_several_processes_on_xla_cpu_are_refused(monkeypatch, tmp_path):
    import pytorch_lightning as pl
    from pytorch_lightning.demos.boring_classes import BoringModel

    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    trainer = pl.Trainer(accelerator="tpu", devices=2, max_steps=1, logger=False, enable_checkpointing=False,
                         default_root_dir=tmp_path)
    assert type(trainer.strategy).__name__ == "TPUSpawnStrategy"
    model = BoringModel()
    with pytest.raises(MisconfigurationException, match=r"CPU_NUM_DEVICES=2.*threads of one process.*devices=1"):
        trainer.fit(model)


@pytest.mark.parametrize(
    ("env", "chips", "expected"),
    [
        ({}, 4, 4),
        ({"TPU_VISIBLE_CHIPS": "0,1"}, 4, 2),
        ({"TPU_VISIBLE_CHIPS": "3"}, 4, 1),
        ({"TPU_PROCESS_BOUNDS": "1,2,1"}, 4, 2),
        ({"TPU_VISIBLE_CHIPS": "0,1,2", "TPU_PROCESS_BOUNDS": "1,2,1"}, 4, 2),
        ({"TPU_PROCESS_BOUNDS": "2,2,1"}, 4, 4),
    ],
)
def test_restricted_tpu_chips_are_counted_as_pjrt_counts_them(monkeypatch, env, chips, expected):
    for name in ("TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tpu_accelerator._tpu_process_count(chips) == expected


@pytest.mark.parametrize(("name", "value"), [("TPU_VISIBLE_CHIPS", "0;1"), ("TPU_PROCESS_BOUNDS", "1,0,1")])
def test_malformed_chip_restrictions_are_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(MisconfigurationException, match=f"`{name}={value}` is not a comma-separated list"):
        tpu_accelerator._tpu_process_count(4)


@RunIf(xla=True)
@pytest.mark.slow
def test_device_index_one_compiles_nothing_in_steady_steps(fork_server):
    """``devices=[1]`` with two XLA:CPU devices: steady steps compile nothing and run one graph each."""
    counts = run_python(
        """
        import sys
        sys.path.insert(0, {tests!r})
        import pytorch_lightning as pl
        from pytorch_lightning.demos.boring_classes import BoringModel
        from helpers.xla_metrics import XLACounters

        class Counts(pl.Callback):
            rows = []
            devices = set()

            def on_train_batch_end(self, trainer, pl_module, *args):
                self.devices.add(str(pl_module.device))
                counters = XLACounters()
                self.rows.append([counters.compiles(), counters.executions()])

        model = BoringModel()
        trainer = pl.Trainer(accelerator="tpu", devices=[1], max_steps=12, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                             callbacks=[Counts()])
        trainer.fit(model)
        assert Counts.devices == {{"xla:1"}}, Counts.devices
        rows = Counts.rows
        emit([[b[i] - a[i] for i in range(2)] for a, b in zip(rows[4:], rows[5:])])
        """.format(tests=TESTS_DIR),
        # the device count is read when the runtime starts: the process sets it, and forks from the server of the
        # other one-device tests
        env={"PJRT_DEVICE": "CPU"},
        set_env={"CPU_NUM_DEVICES": "2"},
        timeout=240,
        fork_server=fork_server,
    )
    assert len(counts) >= 6
    # per steady step: no compilation, one graph (forward, backward and update)
    assert counts == [[0, 1]] * len(counts), counts
