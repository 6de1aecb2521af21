"""A dataloader hook that raises leaves ``DataLoader`` as it found it.

Lightning patches ``__init__``, ``__setattr__`` and ``__delattr__`` of ``DataLoader``, ``BatchSampler`` and their
subclasses while it calls a dataloader hook (``_replace_dunder_methods``), so that it can re-instantiate the loader
later. The patch was undone only when the hook returned: a hook that raised (a missing file, a typo, a refused
argument) left every class patched in the process, and every ``DataLoader`` made afterwards, by the user or by the
next ``fit``, recorded its arguments (``__pl_saved_kwargs``) and went through the wrappers. Upstream's own
``tests_lite/utilities/test_data.py`` and ``tests_pytorch/utilities/test_data.py`` fail that way after an earlier test
of the same process saw a hook raise.
"""
import pytest
from torch.utils.data import BatchSampler, DataLoader

FIXED_BY = "0074-dataloader-classes-restored-when-a-hook-raises.patch"


class MyLoader(DataLoader):
    pass


def _inits():
    return {cls: cls.__dict__.get("__init__") for cls in (DataLoader, BatchSampler, MyLoader)}


def test_the_context_restores_the_classes_when_its_body_raises():
    from lightning_lite.utilities.data import _replace_dunder_methods

    before = _inits()
    with pytest.raises(RuntimeError, match="the hook failed"):
        with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
            assert _inits() != before
            raise RuntimeError("the hook failed")
    assert _inits() == before
    assert not hasattr(MyLoader(range(4)), "__pl_saved_kwargs")


def test_a_trainer_whose_dataloader_hook_raises_leaves_dataloader_as_it_was():
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def train_dataloader(self):
            MyLoader(range(4))
            raise FileNotFoundError("no such dataset")

    before = _inits()
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    with pytest.raises(FileNotFoundError, match="no such dataset"):
        trainer.fit(Model())
    assert _inits() == before
    assert not hasattr(DataLoader(range(4)), "__pl_saved_kwargs")


def test_lite_whose_run_raises_leaves_dataloader_as_it_was():
    from lightning_lite import LightningLite

    class Lite(LightningLite):
        def run(self):
            raise ValueError("the run failed")

    before = _inits()
    with pytest.raises(ValueError, match="the run failed"):
        Lite(accelerator="cpu", devices=1).run()
    assert _inits() == before
