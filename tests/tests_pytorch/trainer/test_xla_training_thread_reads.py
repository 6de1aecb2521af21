"""On XLA the training thread never reads from the device in a steady step: the copy of the step's logged values and
running loss to the host is made on Lightning's copying thread, and the results, the progress bar and the loggers
take the values in one step later (fix `xla-host-copies-off-the-training-thread`). Before it, the training thread
made that copy right after the step's barrier, and so waited for the device to finish the step: one read a step in
every pattern below.

The reads are counted on the training thread itself (``helpers.xla_waits``), and each count is checked against
torch_xla's own transfer counter, so that a read the count missed fails the test instead of passing it."""
import os

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_waits import check_against_the_device_counters, evaluation_run, pattern_run, waits_of

FIXED_BY = "0060-xla-host-copies-off-the-training-thread.patch"


def _what(rows):
    return [row["what"] for row in rows]


@RunIf(xla=True)
# the other patterns of `PATTERNS` are counted with the batches' copies too
# (`xla-single-device-batches-copied-on-loader-threads`)
@pytest.mark.parametrize("pattern", ["automatic", "manual_two_optimizers", "torchmetrics"])
def test_a_steady_training_step_reads_nothing_on_the_training_thread(pattern, tmp_path):
    rows = pattern_run(pattern, tmp_path)
    assert len(rows) >= 4
    for row in rows:
        check_against_the_device_counters(row)
    assert [row["reads"] for row in rows] == [0] * len(rows), _what(rows)
    # nor does it wait for the copying thread (or any other) instead
    assert [row["waits"] for row in rows] == [0] * len(rows), _what(rows)
    # and the step still costs what it cost: no compilation, one graph, at most one transfer (made elsewhere)
    assert {(row["compiles"], row["executions"]) for row in rows} == {(0, 1)}, rows
    assert all(row["transfers_from_device"] <= 1 for row in rows), rows


@RunIf(xla=True)
def test_validation_test_and_predict_steps_read_nothing_on_the_training_thread(tmp_path):
    stages = evaluation_run(tmp_path)
    for stage, rows in stages.items():
        assert len(rows) >= 4, stage
        for row in rows:
            check_against_the_device_counters(row)
        assert [row["reads"] for row in rows] == [0] * len(rows), (stage, _what(rows))
        assert [row["waits"] for row in rows] == [0] * len(rows), (stage, _what(rows))
        assert all(row["transfers_from_device"] <= 1 for row in rows), (stage, rows)


@RunIf(xla=True)
def test_every_process_of_tpu_spawn_reads_nothing_in_a_steady_step(tmp_path, fork_server):
    """Two processes of a simulated TPU host (the gloo harness carries their collectives; its own host reads are left
    out of the count): each one's training thread reads nothing in a steady step, with `sync_dist=True`. The graph
    report is off: the harness's transport costs transfers that a TPU does not make, and the report would trace a step
    for them, which copies on the training thread by design."""
    from helpers.multiprocess_scenarios import run_scenario

    result = run_scenario("training_thread_waits", str(tmp_path), env={"PL_XLA_GRAPH_REPORT": "off"},
                          fork_server=fork_server)
    for rank, rows in enumerate(result["ranks"]):
        assert len(rows) >= 4, rank
        assert [waits_of(row) for row in rows] == [0] * len(rows), (rank, _what(rows))


class _RecordingPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """A plateau scheduler that keeps the metric of every ``step`` (in its state: it is saved with checkpoints)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.got = []

    def step(self, metrics, *args, **kwargs):
        self.got.append(float(metrics))
        return super().step(metrics, *args, **kwargs)


def _csv_rows(root):
    import csv
    import glob

    (path,) = glob.glob(f"{root}/**/metrics.csv", recursive=True)
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.guard  # true before the fix too: the loggers got every step's values, then at once
@RunIf(xla=True)
def test_the_loggers_get_every_step_with_its_own_step_number(tmp_path):
    """Nothing reads the metrics during the steps, so every step's values reach the loggers one step later: each
    row still holds its own step's loss, under its own step number, none is lost, and the validation rows in the
    middle of the epoch and at its end come in their places."""
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.loggers import CSVLogger

    from helpers.xla_waits import pattern_loader, pattern_module

    losses, shown = [], []

    class KeepLosses(Callback):
        # the step's loss, kept on the device and read after the run: nothing is read while it trains
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"])
            # what the progress bar would show now (it reads nothing from the device either)
            shown.append(trainer.progress_bar_callback.get_metrics(trainer, pl_module).get("loss"))

    module = pattern_module("automatic")

    def validation_step(batch, batch_idx):
        module.log("val_loss", module.loss(batch))

    module.validation_step = validation_step
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=2, default_root_dir=tmp_path, logger=CSVLogger(tmp_path),
                      log_every_n_steps=1, val_check_interval=0.5, limit_val_batches=2, enable_checkpointing=False,
                      enable_model_summary=False, callbacks=[KeepLosses()])
    trainer.fit(module, pattern_loader(10), pattern_loader(2))
    expected = [float(loss) for loss in losses]
    rows = _csv_rows(tmp_path)
    logged = {int(r["step"]): float(r["train_loss"]) for r in rows if r.get("train_loss")}
    assert logged == dict(enumerate(expected))
    # the validation runs after steps 5 and 10 of each epoch: logged at the step they ran after
    val_steps = [int(r["step"]) for r in rows if r.get("val_loss")]
    assert val_steps == [4, 9, 14, 19]
    # the bar never shows a `nan` loss while the first losses are on their way, and shows one from the second step
    assert "nan" not in shown and all(loss is not None for loss in shown[1:]), shown


@pytest.mark.guard  # true before the fix too: a read of the metrics in a step gets that step's values
@RunIf(xla=True)
def test_callbacks_decide_from_the_values_of_the_current_step(tmp_path):
    """A callback that prints ``trainer.callback_metrics`` every step, ``ModelCheckpoint`` on a step metric every 2
    steps, ``EarlyStopping`` at the end of the training epoch, a plateau scheduler on a step metric and ``outputs`` in
    ``on_train_batch_end`` all see the values of the step that just ended."""
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.callbacks import EarlyStopping, ModelCheckpoint

    from helpers.xla_waits import pattern_loader, PatternModule

    seen = []
    plateau_got = []

    class Module(PatternModule):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
            return loss

        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.parameters(), lr=0.05)
            plateau = _RecordingPlateau(sgd, patience=100)
            plateau_got.append(plateau.got)
            return {"optimizer": sgd,
                    "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss_step", "interval": "step"}}

    class PrintMetrics(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            metrics = trainer.callback_metrics
            print(metrics)
            seen.append((trainer.global_step, float(outputs["loss"]), float(metrics["train_loss_step"]),
                         float(trainer.logged_metrics["train_loss_step"]),
                         float(trainer.progress_bar_metrics["train_loss_step"])))

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="train_loss_step", every_n_train_steps=2,
                                 save_top_k=2, filename="{step}")
    stopping = EarlyStopping(monitor="train_loss_epoch", check_on_train_epoch_end=True, patience=100)
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=2, default_root_dir=tmp_path, logger=False,
                      enable_model_summary=False, callbacks=[PrintMetrics(), checkpoint, stopping])
    trainer.fit(Module("automatic"), pattern_loader(6))

    losses = {step: loss for step, loss, *_ in seen}
    assert len(losses) == 12
    # the callback, the logged and the progress bar's values of every step are the step's own loss
    assert all(loss == callback == logged == bar for _, loss, callback, logged, bar in seen), seen
    # the plateau scheduler stepped once per step with that step's loss
    assert plateau_got[0] == [losses[step] for step in sorted(losses)]
    # ModelCheckpoint saved after steps 2, 4, ... with the loss of the step it saved at, and kept the 2 lowest
    saved = {int(os.path.basename(p)[len("step="):-len(".ckpt")]): float(s) for p, s in checkpoint.best_k_models.items()}
    expected = sorted(((losses[s], s) for s in losses if s % 2 == 0))[:2]
    assert saved == {s: loss for loss, s in expected}
    # EarlyStopping's best score is the lowest mean loss of an epoch (the same batch size in every step)
    means = [sum(losses[s] for s in range(e * 6 + 1, e * 6 + 7)) / 6 for e in range(2)]
    assert float(stopping.best_score) == pytest.approx(min(means), rel=1e-6)


@pytest.mark.guard  # the earlier form of the fix kept the failed run's last results alive
@RunIf(xla=True)
def test_a_failed_run_keeps_nothing_of_its_last_steps(tmp_path):
    """A step that raises drops the copies in flight; once the run is torn down nothing refers to the results of its
    last steps, and the metrics read afterwards are those that reached the host, without waiting for anything."""
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.utilities.xla_host_transfers import _xla_host_transfers

    from helpers.xla_waits import pattern_loader, pattern_module

    class Fails(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 5:
                raise RuntimeError("the step failed")

    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                      callbacks=[Fails()])
    with pytest.raises(RuntimeError, match="the step failed"):
        trainer.fit(pattern_module("automatic"), pattern_loader(12))
    assert trainer._logger_connector._step_metrics is None
    assert not _xla_host_transfers.busy
    loss = trainer.callback_metrics["train_loss"]
    assert loss.device.type == "cpu" and torch.isfinite(loss)


@pytest.mark.guard  # of the end of the threads, which came with the fix
def test_a_thread_that_does_not_end_in_time_is_named_and_not_waited_for(caplog):
    """Ending the run's threads waits for them against one deadline: a thread that is stuck (a dataloader that
    blocks) is named in a warning once the deadline passes, and the run's end does not hang on it."""
    import logging
    import threading

    from lightning_lite.utilities import xla_threads

    release = threading.Event()

    class Stuck:
        def __init__(self):
            self.thread = threading.Thread(target=release.wait, name="pl-xla-stuck", daemon=True)
            self.thread.start()
            self.stopped = False

        def stop(self):
            self.stopped = True  # asked, but the thread cannot see it: it is blocked

        def threads(self):
            return [self.thread]

    stuck = Stuck()
    xla_threads._register_xla_thread_work(stuck)
    try:
        with caplog.at_level(logging.WARNING, logger=xla_threads.__name__):
            assert xla_threads._end_xla_threads(timeout=0.2) is False
        assert stuck.stopped and stuck.thread.is_alive()
        assert "1 thread(s) working with the XLA device did not end within 0 s: pl-xla-stuck" in caplog.text
    finally:
        release.set()
        stuck.thread.join(5)
    assert xla_threads._end_xla_threads(timeout=5) is True  # ended now, and dropped from the registry
    assert stuck not in xla_threads._work
