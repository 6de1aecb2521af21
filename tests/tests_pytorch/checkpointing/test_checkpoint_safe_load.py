"""Checkpoints Lightning writes load back under torch's safe unpickler, on the CPU and on XLA.

torch 2.6 made ``torch.load(weights_only=True)`` the default, and 1.8.6 loads checkpoints without choosing: a checkpoint
holding a ``pathlib`` path (``ModelCheckpoint(dirpath=Path(...))``), an ``argparse.Namespace`` or enum hyperparameter
or Lightning's ``AttributeDict`` failed to load with "Unsupported global". Lightning now allows those types (enums only
from modules already imported), keeps refusing anything else with a message that names the type and both ways out, and
takes ``weights_only=False`` for trusted files.
"""
import argparse
import dataclasses
import enum
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf, xla_device_reason

ON_XLA = [pytest.mark.xla, pytest.mark.skipif(xla_device_reason() is not None, reason=str(xla_device_reason()))]


class Optim(enum.Enum):
    SGD = "sgd"
    ADAM = "adam"


@dataclasses.dataclass
class Config:
    """A type of the user's own: not something a safe unpickler may rebuild."""

    width: int = 4


class RunsCode:
    """What a malicious checkpoint holds: unpickling it runs a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _data():
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 4, generator=generator)), batch_size=4)


def _model_class():
    from pytorch_lightning import LightningModule
    from pytorch_lightning.utilities.parsing import AttributeDict

    class Model(LightningModule):
        def __init__(self, data_dir=Path("/data"), args=argparse.Namespace(lr=0.1, out=Path("out")),
                     optim=Optim.ADAM, extra=AttributeDict(depth=2), config=None):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx):
            self.log("val", self.layer(batch[0]).sum())

        test_step = validation_step

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Model


def _trainer(accelerator, root, max_epochs=1, **kwargs):
    from pytorch_lightning import Trainer

    return Trainer(accelerator=accelerator, devices=1, max_epochs=max_epochs, default_root_dir=root, logger=False,
                   enable_progress_bar=False, enable_model_summary=False, **kwargs)


def _fit(accelerator, tmp_path, **hparams):
    from pytorch_lightning.callbacks import ModelCheckpoint

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "checkpoints")  # a Path in the callback's state
    model = _model_class()(**hparams)
    _trainer(accelerator, tmp_path, callbacks=[checkpoint]).fit(model, _data())
    return Path(checkpoint.best_model_path)


@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("tpu", marks=ON_XLA)])
def test_lightning_checkpoints_load_back_with_the_safe_unpickler(tmp_path, accelerator):
    from pytorch_lightning.callbacks import ModelCheckpoint

    path = _fit(accelerator, tmp_path)
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(path)), "nothing beyond torch's allowlist"
    Model = _model_class()

    loaded = Model.load_from_checkpoint(path)
    assert loaded.hparams.data_dir == Path("/data")
    assert loaded.hparams.optim is Optim.ADAM
    assert loaded.hparams.args == argparse.Namespace(lr=0.1, out=Path("out")) and loaded.hparams.extra["depth"] == 2
    assert type(loaded.hparams.extra).__name__ == "AttributeDict"

    for run in ("validate", "test"):
        (metrics,) = getattr(_trainer(accelerator, tmp_path), run)(Model(), _data(), ckpt_path=path, verbose=False)
        assert set(metrics) == {"val"}
    predictions = _trainer(accelerator, tmp_path).predict(Model(), _data(), ckpt_path=path)
    assert len(predictions) == 4
    resumed = _trainer(accelerator, tmp_path, max_epochs=2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "c2")])
    resumed.fit(Model(), _data(), ckpt_path=path)
    assert resumed.global_step == 8



@RunIf(xla=True)
def test_an_xla_checkpoint_with_a_class_in_its_hyperparameters_loads_and_resumes(tmp_path):
    """A class is beyond torch's allowlist: a file the user trusts loads with ``weights_only=False``."""
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.utilities.parsing import AttributeDict
    from helpers.hparams_model import Activation, hparams_loader, hparams_trainer, Model

    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True)
    hparams_trainer(tmp_path, callbacks=[checkpoint]).fit(Model(), hparams_loader())
    loaded = Model.load_from_checkpoint(checkpoint.last_model_path, weights_only=False)
    assert loaded.hparams.activation is Activation.TANH and isinstance(loaded.net[1], torch.nn.Tanh)
    assert type(loaded.hparams.extra) is AttributeDict
    resumed = hparams_trainer(tmp_path, max_epochs=2)
    resumed.fit(Model(), hparams_loader(), ckpt_path=checkpoint.last_model_path, weights_only=False)
    assert resumed.global_step == 8

def test_lite_loads_a_checkpoint_with_paths(tmp_path):
    from lightning_lite import LightningLite

    class Lite(LightningLite):
        def run(self):
            pass

    lite = Lite(accelerator="cpu", devices=1)
    lite.save({"root": tmp_path, "args": argparse.Namespace(optim=Optim.SGD)}, tmp_path / "state.ckpt")
    assert lite.load(tmp_path / "state.ckpt") == {"root": tmp_path, "args": argparse.Namespace(optim=Optim.SGD)}


def test_a_type_outside_the_allowlist_is_refused_with_both_ways_out(tmp_path):
    path = _fit("cpu", tmp_path, config=Config(width=8))
    Model = _model_class()
    with pytest.raises(pickle.UnpicklingError) as refused:
        Model.load_from_checkpoint(path)
    message = str(refused.value)
    assert f"holds an object of type `{__name__}.Config`" in message
    assert f"torch.serialization.add_safe_globals([{__name__}.Config])" in message
    assert "load_from_checkpoint(path, weights_only=False)" in message and "weights_only=False)" in message
    with pytest.raises(pickle.UnpicklingError, match="Config"):
        _trainer("cpu", tmp_path, max_epochs=2).fit(Model(), _data(), ckpt_path=path)

    # either way out works
    assert Model.load_from_checkpoint(path, weights_only=False).hparams.config == Config(width=8)
    with torch.serialization.safe_globals([Config]):
        assert Model.load_from_checkpoint(path).hparams.config == Config(width=8)
    trainer = _trainer("cpu", tmp_path, max_epochs=2)
    trainer.fit(Model(), _data(), ckpt_path=path, weights_only=False)
    assert trainer.global_step == 8


def test_a_checkpoint_that_runs_code_is_still_refused(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"payload": RunsCode(marker)}}, path)
    Model = _model_class()
    with pytest.raises(pickle.UnpicklingError, match=r"holds an object of type `(posix|os)\.system`"):
        Model.load_from_checkpoint(path)
    with pytest.raises(pickle.UnpicklingError, match="system"):
        _trainer("cpu", tmp_path).validate(Model(), _data(), ckpt_path=path)
    assert not marker.exists(), "the checkpoint's code ran"


class ReachesATorchFunction:
    """A pickle that takes a function of ``torch`` that a checkpoint of logged values does not hold."""

    def __reduce__(self):
        return getattr, (torch._C._VariableFunctionsClass, "from_file")


class ReachesBuiltins:
    """A pickle that climbs from an allowed function to the ``builtins`` module (and from there to ``eval``)."""

    def __reduce__(self):
        return getattr, (max, "__self__")


@pytest.mark.parametrize("payload", [ReachesATorchFunction(), ReachesBuiltins()], ids=["torch.from_file", "builtins"])
def test_only_the_reductions_of_logged_values_are_reached_through_getattr(tmp_path, payload):
    """The safe unpickler takes ``getattr(torch._C._VariableFunctionsClass, name)`` for the reductions that the
    logged values of a fault-tolerant checkpoint name (``torch.mean``, ...), and nothing else through ``getattr``."""
    from lightning_lite.utilities.cloud_io import _load

    torch.save({"reductions": [torch.mean, torch.sum, torch.max, torch.min, max, min, sum]}, tmp_path / "ok.ckpt")
    assert _load(tmp_path / "ok.ckpt") == {"reductions": [torch.mean, torch.sum, torch.max, torch.min, max, min, sum]}
    torch.save({"payload": payload}, tmp_path / "bad.ckpt")
    with pytest.raises(pickle.UnpicklingError, match=r"holds an object of type `builtins\.getattr`"):
        _load(tmp_path / "bad.ckpt")


def test_an_enum_of_a_module_not_imported_is_refused(tmp_path):
    """Resolving a name from the file must not import anything: only enums of modules already imported pass."""
    import sys

    module = tmp_path / "fork_enum_not_imported.py"
    module.write_text("import enum\nclass Colour(enum.Enum):\n    RED = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import fork_enum_not_imported

        torch.save({"colour": fork_enum_not_imported.Colour.RED}, tmp_path / "colour.ckpt")
        del sys.modules["fork_enum_not_imported"]
        from lightning_lite.utilities.cloud_io import _load

        with pytest.raises(pickle.UnpicklingError, match="fork_enum_not_imported.Colour"):
            _load(tmp_path / "colour.ckpt")
        assert "fork_enum_not_imported" not in sys.modules
        import fork_enum_not_imported  # noqa: F811

        assert _load(tmp_path / "colour.ckpt") == {"colour": fork_enum_not_imported.Colour.RED}
        with open(tmp_path / "colour.ckpt", "rb") as stream:  # a file object: read again from where it started
            assert _load(stream) == {"colour": fork_enum_not_imported.Colour.RED}
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("fork_enum_not_imported", None)


_FAULT_TOLERANT_LOGGING_RUN = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import torch, torchmetrics
import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.mean_loss = torchmetrics.MeanMetric()

    def training_step(self, batch, batch_idx):
        if self.global_step == 5 and not os.environ.get("RESUMED"):
            os.kill(os.getpid(), signal.SIGTERM)
        output = super().training_step(batch, batch_idx)
        self.log("loss", output["loss"], on_step=True, on_epoch=True)
        self.log("loss_max", output["loss"], on_epoch=True, reduce_fx="max")
        self.mean_loss(output["loss"])
        self.log("mean_loss", self.mean_loss, on_step=True, on_epoch=True)
        return output

    def train_dataloader(self):
        return torch.utils.data.DataLoader(RandomDataset(32, 64), batch_size=4)

pl.seed_everything(1)
trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=sys.argv[1], logger=False,
                     enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
trainer.fit(Model(), ckpt_path="last" if os.environ.get("RESUMED") else None)
emit({"global_step": trainer.global_step, "logged": sorted(trainer.callback_metrics)})
"""


@pytest.mark.slow
def test_a_fault_tolerant_checkpoint_of_logged_values_and_a_metric_loads_back(tmp_path):
    """1.8.6's own ``PL_FAULT_TOLERANT_TRAINING=1``: ``SIGTERM`` writes ``.pl_auto_save.ckpt``, whose logged values
    are torchmetrics states that hold their reductions and torchmetrics' ``jit_distributed_available``: the safe
    unpickler refused the checkpoint Lightning itself wrote. The loops' state names those functions since
    ``compat-loops-state-names-its-functions``, and its loader states' random states hold no NumPy array since
    ``compat-numpy-random-state-loads-with-torch-load``: nothing in it is beyond torch's own allowlist. On the CPU: the
    fork refuses the mode on XLA (exact resume's patch), where every checkpoint of ``fit`` resumes exactly."""
    from helpers.xla_subprocess import run_python

    env = {"PJRT_DEVICE": None}
    run = f"import os, sys; sys.argv = ['run', {str(tmp_path)!r}]; os.environ['PL_FAULT_TOLERANT_TRAINING'] = '1'\n"
    with pytest.raises(AssertionError, match=r"subprocess failed \(exit 0\)"):
        run_python(run + _FAULT_TOLERANT_LOGGING_RUN, env=env, timeout=300)
    saved = tmp_path / ".pl_auto_save.ckpt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(str(saved)) == []
    resumed = run_python("import os; os.environ['RESUMED'] = '1'\n" + run + _FAULT_TOLERANT_LOGGING_RUN, env=env,
                         timeout=300)
    assert resumed["global_step"] == 16
    assert {"loss_step", "loss_epoch", "loss_max", "mean_loss_step", "mean_loss_epoch"} <= set(resumed["logged"])


@pytest.mark.parametrize("accelerator", ["cpu", pytest.param("tpu", marks=ON_XLA)])
def test_a_hydra_config_in_the_hyperparameters_loads_and_resumes(tmp_path, accelerator):
    """``save_hyperparameters`` keeps an OmegaConf ``DictConfig`` (what Hydra passes a model) as it is; its containers
    and nodes are plain data, which the safe unpickler rebuilds. On XLA too: 1.8.6's ``XLACheckpointIO`` saved it as
    plain containers (``OmegaConf.to_container``, for ``xm.save``), which lost the type and the interpolations."""
    from omegaconf import DictConfig, OmegaConf

    from pytorch_lightning.callbacks import ModelCheckpoint

    config = OmegaConf.create({"width": 8, "optim": {"name": "sgd", "lr": 0.1, "betas": [0.9, 0.99]}, "x": "${width}"})
    path = _fit(accelerator, tmp_path, config=config)
    Model = _model_class()
    loaded = Model.load_from_checkpoint(path)
    assert isinstance(loaded.hparams.config, DictConfig) and loaded.hparams.config == config
    # the interpolation is kept, and resolves
    assert OmegaConf.to_container(loaded.hparams.config)["x"] == "${width}" and loaded.hparams.config.x == 8
    resumed = _trainer(accelerator, tmp_path, max_epochs=2, callbacks=[ModelCheckpoint(dirpath=tmp_path / "c2")])
    resumed.fit(Model(), _data(), ckpt_path=path)
    assert resumed.global_step == 8


def test_a_hydra_config_loads_where_omegaconf_is_not_imported_yet(tmp_path):
    """A process that has imported only ``lightning_lite`` loads such a checkpoint: OmegaConf is imported for it (a
    package Lightning supports, never a module the file names)."""
    import subprocess
    import sys

    from omegaconf import OmegaConf

    path = tmp_path / "state.ckpt"
    torch.save({"hparams": OmegaConf.create({"width": 8, "layers": [1, 2]})}, path)
    code = (
        "import sys\n"
        "from lightning_lite.utilities.cloud_io import _load\n"
        "assert 'omegaconf' not in sys.modules\n"
        f"state = _load({str(path)!r})\n"
        "print(type(state['hparams']).__name__, state['hparams'].layers[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["DictConfig", "2"]


def test_a_structured_hydra_config_names_the_users_dataclass_and_is_refused(tmp_path):
    """A structured config names the user's dataclass, which the safe unpickler refuses like any type of the user's."""
    from omegaconf import OmegaConf

    path = _fit("cpu", tmp_path, config=OmegaConf.structured(Config(width=8)))
    with pytest.raises(pickle.UnpicklingError, match=rf"`{__name__}\.Config`"):
        _model_class().load_from_checkpoint(path)
    assert _model_class().load_from_checkpoint(path, weights_only=False).hparams.config.width == 8


def test_an_attribute_dict_round_trips_through_the_safe_unpickler(tmp_path):
    """Nested ``AttributeDict`` hyperparameters stay ``AttributeDict`` under ``torch.load(weights_only=True)``: torch
    2.14's safe unpickler sets items on plain dicts only, so the class pickles as a call with a plain dict."""
    from pytorch_lightning.utilities.parsing import AttributeDict

    saved = {"hyper_parameters": {"extra": AttributeDict(depth=2, inner=AttributeDict(width=3))}}
    torch.save(saved, tmp_path / "x.ckpt")
    with torch.serialization.safe_globals([AttributeDict]):
        loaded = torch.load(tmp_path / "x.ckpt", weights_only=True)
    extra = loaded["hyper_parameters"]["extra"]
    assert type(extra) is AttributeDict and type(extra.inner) is AttributeDict
    assert extra == saved["hyper_parameters"]["extra"] and extra.inner.width == 3
    # what it is without Lightning's allowlist: refused as before, with the class named
    with pytest.raises(pickle.UnpicklingError, match="AttributeDict"):
        torch.load(tmp_path / "x.ckpt", weights_only=True)
