"""A ``training_step`` that returns ``None`` skips its batch on XLA as it does on the CPU.

1.8.6 refused it on every TPU run ("Skipping backward by returning `None` from your `training_step` is not implemented
for TPUs"), after the step. On one XLA device the skipped batch leaves no gradient, so the optimizer updates
nothing, exactly as on the CPU. With several processes a replica that skips its ``backward`` skips the all-reduce the
others wait in, so the refusal stays there, with what to do instead.
"""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf

FIXED_BY = "0067-xla-skip-a-batch-whose-training-step-returns-none.patch"

SKIPPED = (1, 4, 5)
BATCHES = 8


def _model():
    from pytorch_lightning import LightningModule

    class SkippingModel(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            if batch_idx in SKIPPED:
                return None
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.1)

    return SkippingModel()


def _loader():
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCHES * 4, 4, generator=generator), torch.randn(BATCHES * 4, 2, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def _fit(accelerator, tmpdir):
    from pytorch_lightning import Trainer

    model = _model()
    trainer = Trainer(accelerator=accelerator, devices=1, max_epochs=1, default_root_dir=tmpdir, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, _loader())
    return model, trainer


@RunIf(xla=True)
def test_a_skipped_batch_on_one_xla_device_updates_nothing_as_on_the_cpu(tmpdir):
    """Adam with a skipped batch: the weights equal the CPU run's, which steps only on the batches it did not skip."""
    cpu_model, cpu_trainer = _fit("cpu", tmpdir)
    xla_model, xla_trainer = _fit("tpu", tmpdir)

    assert xla_trainer.global_step == cpu_trainer.global_step
    for name, expected in cpu_model.state_dict().items():
        torch.testing.assert_close(xla_model.state_dict()[name].cpu(), expected, rtol=1e-5, atol=1e-6, msg=name)
    # the run did train: the skipped batches are the only ones without a change of the weights
    assert not torch.equal(xla_model.layer.weight.cpu(), _model().layer.weight)


@RunIf(xla=True)
def test_several_xla_processes_refuse_a_skipped_batch_and_say_what_to_do(tmpdir, monkeypatch):
    """With several replicas (the world size as a ``tpu_spawn`` replica sees it), a skip is refused with a way out."""
    import torch_xla.runtime as xr

    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    monkeypatch.setattr(xr, "world_size", lambda: 2)
    with pytest.raises(MisconfigurationException) as raised:
        _fit("tpu", tmpdir)

    message = str(raised.value)
    assert "several XLA processes" in message
    assert "`loss * 0`" in message
