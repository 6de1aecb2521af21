"""The Trainer names its stages and functions by their values on every Python the fork supports.

``RunningStage``, ``TrainerFn`` and the other ``LightningEnum`` subclasses mix in ``str``. Python 3.11 formats such
a member by its qualified name in an f-string and in ``format()`` (``f"{RunningStage.TESTING}"`` is
``"RunningStage.TESTING"``; it was ``"test"`` up to 3.10). 1.8.6 built a printed table header, a profiler action, an
error message and the attribute name of the evaluation loop from members that way. Each test below checks one such
site, on the CPU and on the XLA device, and fails on Python 3.11 and later without
``0064-compat-enum-members-formatted-by-value.patch`` (a compat patch: no ``FIXED_BY``).
"""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import xla_device_reason

ON_XLA = [pytest.mark.xla, pytest.mark.skipif(xla_device_reason() is not None, reason=str(xla_device_reason()))]
ACCELERATORS = ["cpu", pytest.param("tpu", marks=ON_XLA)]
EVALUATIONS = ["validate", "test", "predict"]


def _model(batch_size=2):
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.batch_size = batch_size

        def _loss(self, batch):
            return self.layer(batch[0]).pow(2).mean()

        def training_step(self, batch, batch_idx):
            return self._loss(batch)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self._loss(batch))

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self._loss(batch))

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.layer(batch[0])

        def _loader(self):
            generator = torch.Generator().manual_seed(0)
            return DataLoader(TensorDataset(torch.randn(16, 4, generator=generator)), batch_size=self.batch_size)

        train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model()


def _trainer(tmpdir, accelerator, **kwargs):
    from pytorch_lightning import Trainer

    options = dict(accelerator=accelerator, devices=1, max_epochs=1, limit_train_batches=2, limit_val_batches=2,
                   limit_test_batches=2, limit_predict_batches=2, default_root_dir=tmpdir, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    options.update(kwargs)
    return Trainer(**options)


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize(("fn", "header"), [("validate", "Validate metric"), ("test", "Test metric")])
def test_the_results_table_is_headed_by_the_stage(tmpdir, capsys, accelerator, fn, header):
    """``trainer.validate()`` and ``trainer.test()`` print their results under ``Validate metric`` and ``Test
    metric`` (on Python 3.11 without the patch: ``Runningstage.validating metric``)."""
    getattr(_trainer(tmpdir, accelerator), fn)(_model())

    printed = capsys.readouterr().out
    first_row = next(line for line in printed.splitlines() if "metric" in line.lower())
    assert first_row.split()[:2] == header.split(), printed
    assert "runningstage" not in printed.lower()


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("method", EVALUATIONS)
def test_the_batch_size_finder_runs_the_evaluation_loops(tmpdir, accelerator, method):
    """``scale_batch_size(method=...)`` finds the loop of its stage (on Python 3.11 without the patch:
    ``AttributeError: 'Trainer' object has no attribute 'RunningStage.VALIDATING_loop'``)."""
    model = _model(batch_size=2)
    trainer = _trainer(tmpdir, accelerator)

    found = trainer.tuner.scale_batch_size(model, method=method, mode="power", steps_per_trial=1, max_trials=2)

    # two successful trials double the batch size twice; the dataset holds 16 samples
    assert found == 8
    assert model.batch_size == 8


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("fn", EVALUATIONS)
def test_a_missing_dataloader_error_names_the_trainer_method(tmpdir, accelerator, fn):
    """The error for a missing dataloader names ``Trainer.validate``, not ``Trainer.TrainerFn.VALIDATING``."""
    model = _model()
    setattr(model, f"{'val' if fn == 'validate' else fn}_dataloader", None)

    with pytest.raises(ValueError) as raised:
        getattr(_trainer(tmpdir, accelerator), fn)(model)

    message = str(raised.value)
    assert f"`Trainer.{fn}(dataloaders=...)`" in message
    assert f"`.{fn}()` method" in message
    assert "TrainerFn" not in message


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("fn", ["validate", "test"])
def test_the_evaluation_is_profiled_under_its_stage_name(tmpdir, accelerator, fn):
    """The profiler records an evaluation run as ``run_validate_evaluation`` or ``run_test_evaluation``, as its
    report and upstream's profiler tests name it."""
    from pytorch_lightning.profilers import SimpleProfiler

    profiler = SimpleProfiler()
    getattr(_trainer(tmpdir, accelerator, profiler=profiler), fn)(_model(), verbose=False)

    runs = sorted(action for action in profiler.recorded_durations if action.startswith("run_"))
    assert runs == [f"run_{fn}_evaluation"]


@pytest.mark.parametrize("fn", ["fit", "validate", "test", "predict"])
def test_the_fairscale_fsdp_reuse_error_names_the_trainer_method(fn):
    """FairScale's FSDP strategy refuses a module without parameters and names the Trainer method it was given to.

    FairScale itself is not needed to reach the check: it runs when the strategy connects the module."""
    from pytorch_lightning import LightningModule, Trainer
    from pytorch_lightning.strategies import DDPFullyShardedStrategy
    from pytorch_lightning.trainer.states import TrainerFn
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    class Empty(LightningModule):
        pass

    module = Empty()
    module.trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    module.trainer.state.fn = TrainerFn(fn)
    strategy = DDPFullyShardedStrategy()
    strategy._lightning_module = module

    with pytest.raises(MisconfigurationException) as raised:
        strategy.connect(module)

    assert f"`trainer.{fn}()`" in str(raised.value)
    assert "TrainerFn" not in str(raised.value)
