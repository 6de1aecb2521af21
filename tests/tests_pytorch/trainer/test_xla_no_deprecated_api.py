"""A whole run on XLA raises none of the deprecation warnings of today's torch_xla and torchmetrics.

torch_xla 2.9 deprecates ``xm.mark_step()`` ("Use torch_xla.sync instead") and ``xm.xla_device()``; torchmetrics 1.x
deprecates ``Metric._update_called``. Lightning called both on every step. Here every ``DeprecationWarning`` is an
error while the Trainer fits, validates, tests and predicts (automatic and manual optimization, a logged torchmetrics
object, ``precision="bf16"``, ``profiler="xla"``) and while Lite trains, so any call of a deprecated API from
Lightning's code fails the test.
"""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf


def _data():
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(48, 8, generator=generator), torch.randint(0, 2, (48,), generator=generator))


def _module(manual: bool):
    import torchmetrics

    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 2)
            self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=2)
            self.automatic_optimization = not manual

        def _loss(self, batch, name):
            x, y = batch
            out = self.layer(x)
            self.accuracy(out, y)
            self.log(f"{name}_acc", self.accuracy, prog_bar=True)
            loss = torch.nn.functional.cross_entropy(out.float(), y)
            self.log(f"{name}_loss", loss, prog_bar=True)
            return loss

        def training_step(self, batch, batch_idx):
            loss = self._loss(batch, "train")
            if manual:
                optimizer = self.optimizers()
                optimizer.zero_grad()
                self.manual_backward(loss)
                self.clip_gradients(optimizer, gradient_clip_val=1.0)
                optimizer.step()
            return loss

        def validation_step(self, batch, batch_idx):
            self._loss(batch, "val")

        def test_step(self, batch, batch_idx):
            self._loss(batch, "test")

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model()


@RunIf(xla=True)
@pytest.mark.parametrize(("manual", "precision", "profiler"), [
    (False, 32, None),
    (True, 32, None),
    (False, "bf16", None),
    (False, 32, "xla"),
])
def test_trainer_run_calls_no_deprecated_api(tmp_path, manual, precision, profiler):
    from pytorch_lightning import Trainer

    model = _module(manual)
    loader = lambda: DataLoader(_data(), batch_size=16)  # noqa: E731
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=2, precision=precision, profiler=profiler,
                      default_root_dir=tmp_path, enable_model_summary=False,
                      gradient_clip_val=None if manual else 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        trainer.fit(model, loader(), loader())
        (validated,) = trainer.validate(model, loader())
        (tested,) = trainer.test(model, loader())
        predictions = trainer.predict(model, loader())
    assert trainer.global_step == 6 and len(predictions) == 3
    assert {"val_acc", "val_loss"} <= set(validated) and {"test_acc", "test_loss"} <= set(tested)


@RunIf(xla=True)
def test_lite_run_calls_no_deprecated_api():
    from lightning_lite import LightningLite

    class Lite(LightningLite):
        def run(self):
            model = torch.nn.Linear(8, 2)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = self.setup(model, optimizer)
            loader = self.setup_dataloaders(DataLoader(_data(), batch_size=16))
            losses = []
            for x, y in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                self.backward(loss)
                optimizer.step()
                losses.append(loss.item())
            return losses

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        losses = Lite(accelerator="tpu", devices=1).run()
    assert len(losses) == 3
