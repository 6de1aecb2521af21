"""On XLA a step's metrics reach the loggers after the step, once the copying thread brought them to the host
(fix `xla-host-copies-off-the-training-thread`). A callback that logs to the loggers directly, such as
``LearningRateMonitor``, logs in its turn behind them: the loggers get their calls in the order upstream makes them.
In the fix's first form, the learning rate of step N reached the logger before the metrics of step N - 1."""
import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_waits import pattern_loader, PatternModule, RecordingLogger

FIXED_BY = "0060-xla-host-copies-off-the-training-thread.patch"


class _Scheduled(PatternModule):
    def configure_optimizers(self):
        sgd = torch.optim.SGD(self.parameters(), lr=0.05)
        return {"optimizer": sgd, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(sgd, 1, gamma=0.9),
                                                   "interval": "step"}}


def _fit(accelerator, root, batches=8):
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import LearningRateMonitor

    logger = RecordingLogger()
    trainer = Trainer(accelerator=accelerator, devices=1, max_epochs=2, default_root_dir=root, logger=logger,
                      log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False,
                      callbacks=[LearningRateMonitor(logging_interval="step")])
    trainer.fit(_Scheduled("automatic"), pattern_loader(batches))
    return logger


@pytest.mark.guard  # true before the fix too (the metrics reached the loggers at their own step); not in its first form
@RunIf(xla=True)
def test_the_learning_rate_monitor_logs_in_step_order_with_the_deferred_metrics(tmp_path):
    """The loggers get the learning rate and the step's metrics of every step, every step once, in the order and
    under the step numbers of the same run on the CPU."""
    xla = _fit("tpu", tmp_path / "xla")
    cpu = _fit("cpu", tmp_path / "cpu")
    steps = [step for step, _ in xla.calls]
    assert steps == sorted(steps), xla.calls
    # every step present, for each name, once
    for name in ("lr-SGD", "train_loss"):
        assert [step for step, names in xla.calls if name in names] == list(range(16)), (name, xla.calls)
    assert xla.calls == cpu.calls
    # and the learning rates are the scheduler's, step after step
    lrs = [values["lr-SGD"] for values in xla.values if "lr-SGD" in values]
    assert lrs == pytest.approx([0.05 * 0.9**step for step in range(16)])
