"""An interrupted or failed run on XLA leaves nothing queued, frees its Trainer and model, and reports the error
that stopped it even when the teardown fails too (fix `xla-interrupted-runs-leave-nothing-queued`)."""
import gc
import weakref

import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0016-xla-interrupted-runs-leave-nothing-queued.patch"


def _model(stop_with):
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("loss", out["loss"])
            if batch_idx == 3:
                raise stop_with("boom")
            return out

    return Model()


def _trainer(tmp_path):
    from pytorch_lightning import Trainer

    return Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                   enable_progress_bar=False, enable_model_summary=False, max_steps=10, limit_val_batches=0)


@pytest.mark.parametrize(
    "stop_with",
    [
        pytest.param(KeyboardInterrupt, id="ctrl-c"),
        # an error ran the teardown, which flushed the queue, before the fix too
        pytest.param(RuntimeError, id="error", marks=pytest.mark.guard),
    ],
)
@RunIf(xla=True)
def test_interrupted_run_frees_the_trainer_and_the_model(tmp_path, stop_with):
    from pytorch_lightning.utilities.xla_host_transfers import _xla_host_transfers

    model = _model(stop_with)
    trainer = _trainer(tmp_path)
    if stop_with is KeyboardInterrupt:
        trainer.fit(model)  # a Ctrl-C is handled: the run ends, nothing is raised
        assert trainer.interrupted
    else:
        with pytest.raises(RuntimeError, match="boom"):
            trainer.fit(model)
    assert len(_xla_host_transfers) == 0
    refs = [weakref.ref(trainer), weakref.ref(model)]
    del trainer, model
    gc.collect()
    assert [r() for r in refs] == [None, None], "the interrupted run is still referenced"


@RunIf(xla=True)
def test_a_failing_teardown_does_not_hide_the_error_that_stopped_the_run(tmp_path, monkeypatch, caplog):
    trainer = _trainer(tmp_path)

    def failing_teardown():
        raise OSError("teardown failed")

    monkeypatch.setattr(trainer, "_teardown", failing_teardown)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(_model(RuntimeError))
    assert "teardown failed" in caplog.text
