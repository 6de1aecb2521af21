"""Over the steps of what users run (``self.log(..., prog_bar=True)``, the progress bar, the running loss), no graph
is compiled after the first steps, every step costs the same number of graph executions, and nothing piles up from
one step to the next. That takes the fixes from `xla-mark-step-after-optimizer-step` to
`xla-running-loss-joins-the-logged-values-transfer` together (the step barrier, the running loss and the logged
results on the CPU, the evaluation-step barrier, the deferred host copy); each fix's own effect is tested in the
module whose ``FIXED_BY`` names it. The second test fails on the series up to `xla-mark-step-after-optimizer-step`
(the running loss buffer leaves lazy work between steps) and on upstream 1.8.6 with the compatibility patches (the
pending graph grows by about 400 IR nodes a step)."""
import importlib.util
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf
from helpers.xla_metrics import XLACounters

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_xla.py"


def _example_module():
    """The README's example: its module logs ``self.log("train_loss", loss, prog_bar=True)`` every step."""
    spec = importlib.util.spec_from_file_location("train_xla_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


@RunIf(xla=True)
def test_no_recompilation_and_constant_executions_over_40_steps(tmp_path, xla_metrics):
    from pytorch_lightning import Callback, Trainer

    # the README's example module: `self.log("train_loss", loss, prog_bar=True)` every step
    Model = _example_module().MLP

    rows = []

    class Count(Callback):
        def on_train_batch_end(self, trainer, *args):
            rows.append((xla_metrics.compiles(), xla_metrics.executions()))
            # the running loss is in use: the progress bar shows it (a step's loss reaches it one step later)
            assert trainer.global_step < 2 or trainer.fit_loop.running_loss.last() is not None

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


@RunIf(xla=True)
def test_the_example_prints_the_counts_of_a_steady_step(capsys, monkeypatch):
    """``make demo``: 0 compilations, 1 execution and 1 transfer a step. Its window waits for the copies of its own
    steps at both ends; without that the copy of the last step falls outside it and it printed 0.97."""
    monkeypatch.setattr("sys.argv", ["train_xla.py", "--steps", "30", "--warmup", "10"])
    _example_module().main()
    out = capsys.readouterr().out
    assert "compilations/step: 0.00\nexecutions/step:   1.00\ntransfers/step:    1.00\n" in out, out
    assert "upstream 1.8.6 2.00 / 4.00 / 4.00" in out, out


def _live_xla_tensors() -> int:
    import torch_xla.debug.metrics as met

    return (met.counter_value("CreateXlaTensor") or 0) - (met.counter_value("DestroyXlaTensor") or 0)


def _pending_ir_nodes() -> int:
    """IR nodes beyond device data held by live XLA tensors: work that the next barrier would have to run. Reading
    the report compiles, executes and transfers nothing."""
    import torch_xla

    report = torch_xla._XLAC._xla_tensors_report(0, str(torch_xla.device()))
    return sum(1 for line in report.splitlines() if line.strip().startswith("%") and "xla::device_data" not in line)


@RunIf(xla=True)
def test_nothing_accumulates_from_step_to_step(tmp_path):
    """What makes a step slower than the one before is state that grows with the steps: XLA tensors kept alive, a
    lazy graph that is never cut, Python objects that are never freed. Between two steps there must be none of
    it: no more live XLA tensors than the device loader's batches explain, no pending IR, and fewer new Python objects than steps (the benchmark's drift
    column measures the same thing in time, with the noise of a shared machine).

    The objects that existed before ``fit`` are frozen (``gc.freeze``) for the run: each step's collection and count
    then walk only the objects made since, which are the ones that could pile up, instead of the whole pytest
    process's every step."""
    import gc

    from pytorch_lightning import Callback, Trainer

    XLACounters.clear()
    rows = []

    class Probe(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            # the previous step is over, its progress bar update included
            gc.collect()
            rows.append((batch_idx, _live_xla_tensors(), _pending_ir_nodes(), len(gc.get_objects())))

    steps = 60
    n = steps * 32
    data = DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))), batch_size=32)
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=steps, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, callbacks=[Probe()])
    assert trainer.progress_bar_callback is not None
    model = _example_module().MLP()
    gc.collect()
    gc.freeze()
    try:
        trainer.fit(model, data)
    finally:
        gc.unfreeze()
    assert len(rows) == steps
    steady = rows[10:]
    # the loader thread holds the batches it copied ahead, up to `ahead` of them plus the one it is copying, and
    # how many it holds when a step starts depends on how far that thread got: the live XLA tensors go up and down
    # by as many, at most. State that grows by one tensor a step lifts the count by one per step instead, and the
    # second half of the run then reaches higher than the first by far more than the loader's own swing
    from lightning_lite.utilities.xla_batches import _AHEAD

    swing = (_AHEAD + 1) * 2  # two tensors a batch
    half = len(steady) // 2
    first, second = [r[1] for r in steady[:half]], [r[1] for r in steady[half:]]
    assert half > 2 * swing
    assert max(second) <= max(first) + swing, f"live XLA tensors grow from step to step: {steady}"
    assert all(r[2] == 0 for r in steady), f"lazy work is left pending between steps: {steady}"
    grown = steady[-1][3] - steady[0][3]
    assert grown < len(steady) - 1, f"{grown} Python objects more after {len(steady) - 1} steps: {steady}"
