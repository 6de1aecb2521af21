"""At a step's barrier the training thread hands on only the copies of the step values that the copying thread has
made, and waits for one only when more than ``_MAX_COPIES_IN_FLIGHT`` are in flight (fix
`xla-host-copies-off-the-training-thread`). Before, it waited for the previous step's copy at every barrier: a copy
is made once the graphs in flight have run, so it waited for the device through the copying thread.

The copying thread's copies are held here (``_Gate``) until the training thread waits for one: whether it waits
then does not depend on how fast the device or the thread is, and the counts are exact."""
import threading

import pytest

from helpers.runif import RunIf
from helpers.xla_waits import _graph_report_off, pattern_loader, pattern_module, RecordingLogger
from helpers.xla_waits import TrainingThreadWaits

FIXED_BY = "0060-xla-host-copies-off-the-training-thread.patch"

#: the bound this test expects (``xla_host_transfers._MAX_COPIES_IN_FLIGHT``, checked at the end)
BOUND = 3


class _Gate:
    """Holds the copies that the copying thread makes after ``hold()``, in their order, until ``release_one()`` lets
    the oldest held one through; ``open()`` lets them all through. A held copy waits ``timeout`` seconds at most."""

    def __init__(self, timeout: float = 30.0) -> None:
        self._cond = threading.Condition()
        self.holding = False
        self.arrived = 0  # copies that reached the gate while it held them
        self.released = 0
        self.timed_out = 0
        self.timeout = timeout

    def wrap(self, make):
        gate = self

        def held_make(copy, *args, **kwargs):
            with gate._cond:
                if gate.holding:
                    turn = gate.arrived
                    gate.arrived += 1
                    if not gate._cond.wait_for(lambda: not gate.holding or gate.released > turn, gate.timeout):
                        gate.timed_out += 1
            return make(copy, *args, **kwargs)

        return held_make

    def hold(self) -> None:
        with self._cond:
            self.holding = True

    def release_one(self) -> None:
        with self._cond:
            if self.holding:
                self.released += 1
                self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self.holding = False
            self._cond.notify_all()


@RunIf(xla=True)
def test_the_training_thread_waits_for_a_copy_only_past_the_bound(tmp_path, monkeypatch):
    """With every copy held until the training thread waits for it, the steps after the gate closed wait 0 times
    while at most ``BOUND`` copies are in flight, then once a step (for the oldest copy, which the gate then lets
    through). The loggers still get every step, in order, and the results are exact at the end."""
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.callbacks import LearningRateMonitor
    from pytorch_lightning.utilities import xla_host_transfers
    from pytorch_lightning.utilities.xla_host_transfers import _xla_host_transfers

    gate = _Gate()
    monkeypatch.setattr(xla_host_transfers._Copy, "make", gate.wrap(xla_host_transfers._Copy.make))
    waits = TrainingThreadWaits()

    def on_block(kind, obj):
        # the training thread waits for a held copy: let the oldest one through
        if any(obj is copy.done for copy in _xla_host_transfers._in_flight):
            gate.release_one()

    waits.on_block = on_block
    warmup, batches = 3, 12
    where, in_flight, losses = [], [], []

    class Probe(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == warmup:
                with waits.paused():
                    _xla_host_transfers.wait_for_copies()  # the copies of the warm-up are made, none is held
                gate.hold()
            where.append(len(waits.where))
            in_flight.append(len(_xla_host_transfers._in_flight))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(outputs["loss"])

    logger = RecordingLogger()
    with _graph_report_off():
        trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, default_root_dir=tmp_path, logger=logger,
                          log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False,
                          callbacks=[Probe(), LearningRateMonitor(logging_interval="step")])
    try:
        with waits.counting():
            trainer.fit(pattern_module("automatic"), pattern_loader(batches))
    finally:
        gate.open()
    assert gate.timed_out == 0 and gate.arrived >= batches - warmup
    # the training thread's waits for the copying thread in each step after the gate closed: none while the copies in
    # flight stay within the bound, then one, for the oldest copy. (Only these waits are this test's: its batches
    # are copied on the training thread without the loader threads of a later fix, and with them a loader that is
    # behind would be waited for too.)
    steps = [waits.where[a:b] for a, b in zip(where[warmup:], where[warmup + 1:])]
    steady = [sum(what.startswith("wait: Event.wait at xla_host_transfers.py") for what in step) for step in steps]
    assert steady == [0] * BOUND + [1] * (batches - warmup - 1 - BOUND), steps
    # the copies in flight at the start of each step after the gate closed: up to the bound, then the bound
    assert in_flight[warmup:] == [1] + [min(i, BOUND) for i in range(1, batches - warmup)]
    # the loggers got every step's loss, under its own step, in order, with the learning rate of each step before it
    assert [step for step, _ in logger.calls] == sorted(step for step, _ in logger.calls)
    logged = [(step, values["train_loss"]) for (step, _), values in zip(logger.calls, logger.values)
              if "train_loss" in values]
    assert logged == [(step, pytest.approx(float(loss))) for step, loss in enumerate(losses)]
    assert [step for step, names in logger.calls if "lr-SGD" in names] == list(range(batches))
    assert xla_host_transfers._MAX_COPIES_IN_FLIGHT == BOUND
