"""Over 40 steps of what users run (``self.log(..., prog_bar=True)``, the progress bar, the running loss), no graph
is compiled after the first steps and every step costs the same number of graph executions (fixes 0005-0008
together; each fix's own effect is tested in the module that names it)."""
import importlib.util
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_xla.py"


@RunIf(xla=True)
def test_no_recompilation_and_constant_executions_over_40_steps(tmp_path, xla_metrics):
    from pytorch_lightning import Callback, Trainer

    # the README's example module: `self.log("train_loss", loss, prog_bar=True)` every step
    spec = importlib.util.spec_from_file_location("train_xla_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    Model = example.MLP

    rows = []

    class Count(Callback):
        def on_train_batch_end(self, trainer, *args):
            rows.append((xla_metrics.compiles(), xla_metrics.executions()))
            # the running loss is in use: the progress bar shows it
            assert trainer.fit_loop.running_loss.last() is not None

    n = 40 * 32
    data = DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))), batch_size=32)
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=40, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, callbacks=[Count()])
    assert trainer.progress_bar_callback is not None
    trainer.fit(Model(), data)
    assert len(rows) == 40
    warmup = 5
    compiles_after_warmup = rows[-1][0] - rows[warmup][0]
    assert compiles_after_warmup == 0, rows
    per_step = {b[1] - a[1] for a, b in zip(rows[warmup:], rows[warmup + 1:])}
    assert len(per_step) == 1 and per_step.pop() >= 1, rows
