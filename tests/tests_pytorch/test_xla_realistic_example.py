"""examples/tpu_realistic.py, what a TPU user writes (DataModule, torchmetrics, ModelCheckpoint, EarlyStopping,
LearningRateMonitor with a scheduler, CSVLogger, bf16, fit / validate / test / predict, resume with ``ckpt_path=``),
run once in a fresh process on one XLA device (XLA:CPU in CI). Its JSON report holds the graph counts per phase
and what the resumed run started from.

Targets, the fork's targets for everyday TPU code: per training step in the steady state, and per validation, test
and predict batch: 0 compilations, 1 graph execution, at most 1 device-to-host transfer; bf16 in the step graph; the
resumed run starts at the saved global step and epoch with the saved EarlyStopping and ModelCheckpoint state.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lightning_lite
import pytorch_lightning
from helpers.runif import RunIf

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tpu_realistic.py"
EPOCHS, MORE_EPOCHS, TRAIN_BATCHES = 3, 2, 8  # the example's defaults: 8 training batches per epoch
PHASES = ("fit", "fit_validation", "validate", "test", "predict")


@pytest.fixture(scope="module")
def report(computed_once):
    """The example's report, made once per session (the ``computed_once`` fixture: shared by the pytest-xdist
    workers)."""
    return computed_once("realistic-example", _run_the_example)


def _run_the_example(out: Path) -> dict:
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    # the fork tree the tests import, for the fresh interpreter too
    roots = sorted({str(Path(m.__file__).resolve().parent.parent) for m in (lightning_lite, pytorch_lightning)})
    env["PYTHONPATH"] = os.pathsep.join([*roots, env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--out", str(out / "run"), "--epochs", str(EPOCHS), "--more-epochs",
         str(MORE_EPOCHS), "--json", str(out / "report.json")],
        cwd=out, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    data = json.loads((out / "report.json").read_text())
    data["_out"] = str(out / "run")
    return data


@RunIf(xla=True)
def test_every_phase_runs_one_graph_per_batch(report):
    assert report["lightning"].startswith("1.8.6")
    counts = {p: report[p] for p in PHASES}
    missed = []
    for phase, c in counts.items():
        if c is None or c["batches"] < 2:
            missed.append(f"{phase}: too few batches counted ({c})")
            continue
        if c["compiles"] != 0:
            missed.append(f"{phase}: {c['compiles']:.2f} compilations per batch after warm-up (target 0)")
        if c["executions"] != 1:
            missed.append(f"{phase}: {c['executions']:.2f} executions per batch (target 1)")
        if c["transfers"] > 1:
            missed.append(f"{phase}: {c['transfers']:.2f} transfers per batch (target at most 1)")
    if report["bf16_in_step_graph"] is not True:
        missed.append("precision='bf16': no bf16 in the training step graph (target: bf16)")
    assert not missed, "; ".join(missed) + f"\ncounts: {json.dumps(counts)}"


@RunIf(xla=True)
def test_resume_continues_from_the_saved_step_and_callback_state(report):
    res = report["resume"]
    saved, start, end = res["saved"], res["at_start"], res["end"]
    assert res["ckpt_path"] == "last.ckpt"
    assert saved["global_step"] == EPOCHS * TRAIN_BATCHES and saved["epoch"] == EPOCHS
    mismatched = {k: (saved[k], start[k]) for k in saved if start[k] != saved[k]}
    assert not mismatched, f"the resumed run did not start from the saved state (saved, at start): {mismatched}"
    assert end["global_step"] == (EPOCHS + MORE_EPOCHS) * TRAIN_BATCHES
    assert end["epoch"] == EPOCHS + MORE_EPOCHS


@RunIf(xla=True)
def test_the_run_trains_logs_and_checkpoints(report):
    m = report["metrics"]
    # four separable classes: far above chance (0.25) after three epochs
    assert m["val_acc"] > 0.7 and m["test_acc"] > 0.7, m
    assert 0 < m["val_loss"] < 1.0, m
    # LearningRateMonitor logged StepLR's decay (gamma 0.7) once per epoch through the CSVLogger
    assert m["lr_logged"] == pytest.approx([0.1 * 0.7**i for i in range(EPOCHS)]), m["lr_logged"]
    assert report["predict_batches"] == 4 and report["predict_shape"] == [128]
    assert "last.ckpt" in report["checkpoints"]
    assert f"epoch={EPOCHS - 1}-step={EPOCHS * TRAIN_BATCHES}.ckpt" in report["checkpoints"]
    assert report["csv_logs"] == ["logs/version_0/metrics.csv", "logs/version_1/metrics.csv"]
    assert report["early_stopped"] is False
