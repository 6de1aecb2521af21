"""Every evaluation step on XLA runs as one graph of its own, even when it reads nothing (fix
`xla-evaluation-steps-end-with-a-barrier`)."""
from typing import List

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf

FIXED_BY = "0009-xla-evaluation-steps-end-with-a-barrier.patch"


def _module():
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        """Adds each step's output to a device tensor that nothing reads during the epoch, as a running sum or a
        metric state does."""

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
            self.total = None

        def _accumulate(self, batch):
            out = self.net(batch[0]).sum()
            self.total = out if self.total is None else self.total + out

        def validation_step(self, batch, batch_idx):
            self._accumulate(batch)

        def test_step(self, batch, batch_idx):
            self._accumulate(batch)

    return Model()


def _counting_callback(xla_metrics, rows: List[List[int]]):
    from pytorch_lightning import Callback

    class Count(Callback):
        def _snapshot(self, *args):
            rows.append([xla_metrics.compiles(), xla_metrics.executions()])

        on_validation_batch_end = on_test_batch_end = _snapshot

    return Count()


@RunIf(xla=True)
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_an_evaluation_step_that_reads_nothing_runs_its_graph(tmp_path, xla_metrics, stage):
    from pytorch_lightning import Trainer

    rows: List[List[int]] = []
    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False,
                      enable_model_summary=False, enable_progress_bar=False,
                      callbacks=[_counting_callback(xla_metrics, rows)])
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(60, 16, generator=g)), batch_size=5)
    model = _module()
    getattr(trainer, stage)(model, data)
    steady = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(rows[3:], rows[4:])]
    assert {s[1] for s in steady} == {1}, f"executions per {stage} step: {steady}"
    assert {s[0] for s in steady} == {0}, f"compilations per {stage} step: {steady}"
    # the sum is a materialized value, not the graph of the whole epoch
    import torch_xla

    ir = torch_xla._XLAC._get_xla_tensors_text([model.total])
    pending = [line for line in ir.splitlines() if line.strip().startswith("%") and "xla::device_data" not in line]
    assert pending == [], f"graph still pending after the last {stage} step: {pending[:3]}"
