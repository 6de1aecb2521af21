"""``profiler="xla"`` works in fit, validate, test and predict on an XLA device (fix
`xla-profiler-leaves-the-step-barrier-to-its-step-trace`).

The profiler records evaluation steps with ``xp.StepTrace``, which holds an IR scope; torch_xla refuses a barrier
inside it. Before the fix every evaluation step failed with "Expecting scope to be empty".
"""
import socket

import torch

from helpers.runif import RunIf
from helpers.xla_metrics import XLACounters

FIXED_BY = "0015-xla-profiler-leaves-the-step-barrier-to-its-step-trace.patch"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@RunIf(xla=True)
def test_xla_profiler_in_every_loop(tmp_path):
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.profilers import XLAProfiler

    runs = []  # per evaluation run: graphs executed when each batch starts

    class Count(Callback):
        def _begin(self, trainer, *args):
            runs.append((trainer.state.stage.value, []))

        def _batch(self, *args):
            runs[-1][1].append(XLACounters().executions())

        on_validation_start = on_test_start = on_predict_start = _begin
        on_validation_batch_start = on_test_batch_start = on_predict_batch_start = _batch

    class Model(BoringModel):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", self.layer(batch).sum())

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.layer(batch).sum())

        def training_epoch_end(self, outputs):
            pass

        def validation_epoch_end(self, outputs):
            pass

        def test_epoch_end(self, outputs):
            pass

    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                      max_steps=4, limit_train_batches=4, limit_val_batches=6, limit_test_batches=6,
                      limit_predict_batches=6, profiler=XLAProfiler(port=_free_port()), callbacks=[Count()])
    model = Model()
    trainer.fit(model)
    validated = trainer.validate(model)
    tested = trainer.test(model)
    predictions = trainer.predict(model)
    assert len(predictions) == 6 and all(isinstance(p, torch.Tensor) for p in predictions)
    assert "val_loss" in validated[0] and "test_loss" in tested[0]
    # each evaluation step is still one graph: the profiler's step trace ends it
    stages = {stage for stage, _ in runs}
    assert {"validate", "test", "predict"} <= stages, stages
    for stage, counts in runs:
        steady = [b - a for a, b in zip(counts[1:], counts[2:])]
        assert set(steady) <= {1}, (stage, counts)
