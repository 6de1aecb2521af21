"""The preemption handling takes ``SIGTERM`` on XLA only when nothing else handles it, as 1.8.6's own handlers do.

1.8.6 leaves a ``SIGTERM`` handler that is already set in place, and installs its own for SLURM's auto-requeue (and
for the fault-tolerant mode, which the fork refuses on XLA: ``test_xla_exact_resume.py``). Each test sets the handlers
of this process itself, sends it a real ``SIGTERM`` in the middle of a real fit on the XLA device and checks which
handler ran: the run goes on, and no preemption checkpoint is written.
"""
import os
import signal

import pytest

from helpers.runif import RunIf

FIXED_BY = "0057-feature-xla-preemption.patch"

MAX_STEPS = 4
SIGNAL_AT_STEP = 2


def _sigterm_at_step_2():
    from pytorch_lightning import Callback

    class SigtermAtStep(Callback):
        """Sends this process ``SIGTERM`` after the second step, and records the handlers in effect during fit."""

        def __init__(self, other_signal=None):
            self.other_signal = other_signal
            self.sigterm_handler = self.other_handler = None

        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == SIGNAL_AT_STEP:
                self.sigterm_handler = signal.getsignal(signal.SIGTERM)
                if self.other_signal is not None:
                    self.other_handler = signal.getsignal(self.other_signal)
                os.kill(os.getpid(), signal.SIGTERM)

    return SigtermAtStep


def _trainer(tmp_path, callback, **kwargs):
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint

    return Trainer(accelerator="tpu", devices=1, max_steps=MAX_STEPS, limit_val_batches=0, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                   callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpts"), callback], **kwargs)


@pytest.fixture
def sigterm_default():
    """This process's ``SIGTERM`` at its default action before the test and after it."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


@RunIf(xla=True)
def test_a_sigterm_handler_of_the_user_keeps_sigterm_during_fit(tmp_path, sigterm_default):
    from pytorch_lightning.demos.boring_classes import BoringModel

    received = []

    def users_handler(signum, frame):
        received.append(signum)

    signal.signal(signal.SIGTERM, users_handler)
    callback = _sigterm_at_step_2()()
    trainer = _trainer(tmp_path, callback)
    trainer.fit(BoringModel())

    assert callback.sigterm_handler is users_handler
    assert received == [signal.SIGTERM]
    assert trainer.global_step == MAX_STEPS and trainer._xla_preemption is None
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["epoch=0-step=4.ckpt"]
    assert signal.getsignal(signal.SIGTERM) is users_handler


@RunIf(xla=True)
def test_slurm_auto_requeue_keeps_sigterm_and_its_requeue_signal(tmp_path, sigterm_default, monkeypatch, caplog):
    from lightning_lite.plugins.environments import SLURMEnvironment
    from pytorch_lightning.demos.boring_classes import BoringModel

    previous_usr2 = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        callback = _sigterm_at_step_2()(other_signal=signal.SIGUSR2)
        trainer = _trainer(tmp_path, callback, plugins=[SLURMEnvironment(auto_requeue=True,
                                                                         requeue_signal=signal.SIGUSR2)])
        with caplog.at_level("INFO", logger="pytorch_lightning.trainer.connectors.signal_connector"):
            trainer.fit(BoringModel())
        assert [h.__qualname__ for h in callback.sigterm_handler.signal_handlers] == ["SignalConnector.sigterm_handler_fn"]
        assert [h.__qualname__ for h in callback.other_handler.signal_handlers] == [
            "SignalConnector.slurm_sigusr_handler_fn"
        ]
        # SLURM's SIGTERM handler lets the run go on
        assert "bypassing sigterm" in caplog.text
        assert trainer.global_step == MAX_STEPS and trainer._xla_preemption is None
        assert sorted(os.listdir(tmp_path / "ckpts")) == ["epoch=0-step=4.ckpt"]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR2, previous_usr2)


@RunIf(xla=True)
def test_slurm_without_auto_requeue_leaves_sigterm_at_its_default(tmp_path, sigterm_default):
    from lightning_lite.plugins.environments import SLURMEnvironment
    from pytorch_lightning import Callback
    from pytorch_lightning.demos.boring_classes import BoringModel

    class SeeHandler(Callback):
        def on_train_batch_end(self, *args):
            self.during = signal.getsignal(signal.SIGTERM)

    seen = SeeHandler()
    trainer = _trainer(tmp_path, seen, plugins=[SLURMEnvironment(auto_requeue=False)])
    trainer.fit(BoringModel())
    assert seen.during is signal.SIG_DFL
    assert trainer.global_step == MAX_STEPS
