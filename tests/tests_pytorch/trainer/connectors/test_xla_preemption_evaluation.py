"""A ``SIGTERM`` during ``trainer.validate``, ``test`` or ``predict`` on XLA ends them at their next batch, with the
exit status of a preempted run (75) and one line: they have nothing to save, and a VM that is going away must not
spend its notice on the rest of the pass. Before, the process died of the signal (status -15).

Each run is a real process (forked from the ``fork_server`` of its environment) that sends itself a real ``SIGTERM``
after a batch on its XLA device.
"""
import json

import pytest

from helpers.runif import RunIf

FIXED_BY = "0057-feature-xla-preemption.patch"

_RUN = """
import json, os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from pytorch_lightning import Callback, Trainer
from pytorch_lightning.demos.boring_classes import BoringModel

stage, out = sys.argv[1], sys.argv[2]


class SigtermAfterBatch(Callback):
    def __init__(self):
        self.batches = []

    def _batch_end(self, trainer, batch_idx):
        self.batches.append(batch_idx)
        if batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._batch_end(trainer, batch_idx)

    on_test_batch_end = on_validation_batch_end
    on_predict_batch_end = on_validation_batch_end

    def on_exception(self, trainer, pl_module, exception):
        with open(out, "w") as f:
            json.dump({"batches": self.batches, "exception": type(exception).__name__}, f)


trainer = Trainer(accelerator="tpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                  default_root_dir=os.path.dirname(out), callbacks=[SigtermAfterBatch()], limit_val_batches=8,
                  limit_test_batches=8, limit_predict_batches=8)
getattr(trainer, stage)(BoringModel())
print("@@after the stage@@")
"""


@RunIf(xla=True)
@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_a_sigterm_ends_an_evaluation_at_its_next_batch(tmp_path, fork_server, stage):
    out = tmp_path / "report.json"
    proc = fork_server({"PJRT_DEVICE": "CPU"}).run(_RUN, [stage, str(out)], timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 75, f"exit status {proc.returncode}\n{output[-4000:]}"
    # the batch in flight finished, and no other started; the callbacks heard of it
    assert json.loads(out.read_text()) == {"batches": [0, 1], "exception": "XLAPreempted"}
    assert output.count(
        f"SIGTERM: stopped `trainer.{stage}` after 2 batches of its dataloader; only `fit` saves a checkpoint."
        " Exiting with status 75.\n"
    ) == 1
    assert "Traceback" not in output and "@@after the stage@@" not in output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
