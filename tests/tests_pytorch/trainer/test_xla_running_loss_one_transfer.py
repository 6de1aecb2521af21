"""On XLA the running loss comes to the host in the same transfer as the logged values: one transfer per step
(fix `xla-running-loss-joins-the-logged-values-transfer`)."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0011-xla-running-loss-joins-the-logged-values-transfer.patch"


def _data() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(96, 16, generator=g), torch.randint(0, 4, (96,), generator=g)),
                      batch_size=8)


def _module():
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def train_dataloader(self):
            return _data()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Model()


@RunIf(xla=True)
def test_one_host_transfer_per_step_for_the_running_loss_and_the_logged_values(tmp_path, xla_metrics):
    """Before the fix the running loss was copied on its own, in addition to the batched copy of the logged values."""
    from pytorch_lightning import Callback

    marks = []

    class Count(Callback):
        def on_train_batch_end(self, trainer, *args):
            marks.append(xla_metrics.transfers())

    trainer = fit_on_xla(_module(), tmp_path, max_steps=12, callbacks=[Count()], enable_progress_bar=True)
    assert trainer.global_step == 12  # one epoch: no epoch-end reads in the window
    per_step = [b - a for a, b in zip(marks[3:], marks[4:])]
    assert per_step and max(per_step) <= 1, f"device-to-host transfers per step: {per_step}"


@pytest.mark.guard  # true before the fix too: fetching the loss with the logged values must not lose a step
@RunIf(xla=True)
def test_running_loss_is_complete_without_a_progress_bar(tmp_path, xla_metrics):
    """Without a progress bar nothing reads the running loss during the run; a read after it sees every step."""
    from pytorch_lightning.utilities.xla_host_transfers import _xla_host_transfers

    trainer = fit_on_xla(_module(), tmp_path, max_steps=5)
    # nothing is left queued once `fit` returns: the queue would keep the loop (and the trainer) alive
    assert len(_xla_host_transfers) == 0
    running = trainer.fit_loop.running_loss
    assert running.last() is not None
    assert running.memory.device.type == "cpu"
    assert running.current_idx == 5 and not running.rotated


@pytest.mark.guard  # the values were right before the fix; the shared transfer must not change them
@RunIf(xla=True)
@pytest.mark.parametrize("accumulate", [1, 3])
def test_running_loss_matches_the_cpu_accelerator(tmp_path, xla_metrics, accumulate):
    def run(accelerator):
        from pytorch_lightning import Trainer

        trainer = Trainer(accelerator=accelerator, devices=1, max_steps=4, accumulate_grad_batches=accumulate,
                          default_root_dir=tmp_path / accelerator, logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(_module())
        running = trainer.fit_loop.running_loss
        return running.mean(), running.current_idx

    (xla_mean, xla_n), (cpu_mean, cpu_n) = run("tpu"), run("cpu")
    assert xla_n == cpu_n == 4 * accumulate
    torch.testing.assert_close(xla_mean, cpu_mean, rtol=1e-4, atol=1e-5)
