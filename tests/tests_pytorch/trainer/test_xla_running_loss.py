"""The running training loss lives on the CPU when training on XLA (fix `running-loss-on-cpu-for-xla`)."""
import torch

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0007-running-loss-on-cpu-for-xla.patch"


def _model_and_probe(xla_metrics):
    from pytorch_lightning import Callback
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def training_epoch_end(self, outputs):
            pass

    class Probe(Callback):
        def __init__(self):
            self.rows = []

        def on_train_batch_end(self, trainer, *args):
            running = trainer.fit_loop.running_loss
            running.last()  # a read, as the progress bar's
            # (on XLA a step's loss reaches the running loss one step later: the first step finds it empty)
            memory = running.memory
            device = None if memory is None else memory.device.type
            self.rows.append((device, xla_metrics.compiles(), xla_metrics.executions()))

    return Model(), Probe()


@RunIf(xla=True)
def test_running_loss_buffer_is_on_cpu_and_right(tmp_path, xla_metrics):
    model, probe = _model_and_probe(xla_metrics)
    trainer = fit_on_xla(model, tmp_path, max_steps=4, callbacks=[probe])
    assert [row[0] for row in probe.rows][1:] == ["cpu"] * 3
    # the parameters stay on the XLA device during training: only the running loss moved
    assert trainer.fit_loop.running_loss.last() is not None
    running = trainer.fit_loop.running_loss
    assert running.memory.dtype == torch.float32 and running.memory.shape == (20,)


@RunIf(xla=True)
def test_running_loss_shown_on_the_progress_bar_does_not_recompile(tmp_path, xla_metrics):
    """The progress bar reads the running loss every step. With the buffer on the device each step wrote a new
    index, a new graph (a compilation) for each of the 20 slots of the window."""
    model, probe = _model_and_probe(xla_metrics)
    fit_on_xla(model, tmp_path, max_steps=30, callbacks=[probe], enable_progress_bar=True)
    compiles = [row[1] for row in probe.rows]
    executions = [row[2] for row in probe.rows]
    assert compiles[-1] - compiles[5] == 0, compiles
    per_step = {b - a for a, b in zip(executions[5:], executions[6:])}
    assert per_step == {1}, executions
