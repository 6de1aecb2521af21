"""The runs of the exact-resume tests: an uninterrupted run, a run killed with ``SIGKILL`` at a step, and its resume
from one of its checkpoints, each a real process of ``helpers/preemption_runs.py``, compared step by step.

The tests pass their ``computed_once`` and ``fork_server`` fixtures (``tests/conftest.py``): the uninterrupted runs
that differ only in how they checkpoint are computed once per session.
"""
import csv
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from helpers.preemption_runs import weights_diff

SINGLE_ENV = {"PJRT_DEVICE": "CPU"}
SPMD_ENV = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}
# two processes through the simulated TPU host of `helpers/gloo_xla_collectives.py`
SPAWN_ENV = {"PJRT_DEVICE": None, "CPU_NUM_DEVICES": None}
KILLED = -signal.SIGKILL
# the options of a run that change only how it checkpoints, not what it trains
CHECKPOINTING_ONLY = ("background_writes", "every_n_train_steps", "every_n_epochs", "save_on_train_epoch_end",
                      "train_time_interval", "sharded", "kill_after_writes", "user_save",
                      "early_stopping")


def run_config(fork_server: Any, config: Dict[str, Any], env: Dict[str, Optional[str]], status: int) -> str:
    code = "import json, sys\nfrom helpers.preemption_runs import main\nmain(json.loads(sys.argv[1]))"
    proc: subprocess.CompletedProcess = fork_server(env).run(code, [json.dumps(config)], timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, f"exit status {proc.returncode}, not {status}\n{out[-6000:]}"
    return out


def report_of(folder: Path) -> Dict[str, Any]:
    return json.loads((folder / "report-rank0.json").read_text())


def logged_values(folder: Path) -> List[Tuple[int, str, str]]:
    """``(step, key, value)`` of every value the CSV logger wrote."""
    with open(folder / "run" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return sorted((int(row["step"]), key, value) for row in rows for key, value in row.items()
                  if key not in ("step", "epoch") and value != "")


def reference_run(computed_once: Any, fork_server: Any, env: Dict[str, Optional[str]], config: Dict[str, Any]
                  ) -> Dict[str, Any]:
    def run(folder: Path) -> Dict[str, Any]:
        run_config(fork_server, {**config, "dirpath": str(folder / "ckpts"), "logs": str(folder / "logs"),
                                 "out": str(folder / "run")}, env, status=0)
        rank1 = folder / "run" / "report-rank1.json"
        return {"report": report_of(folder / "run"), "logged": logged_values(folder / "logs"),
                "rank1": json.loads(rank1.read_text()) if rank1.exists() else None}

    return computed_once("exact-resume-reference-" + json.dumps(config, sort_keys=True), run)


def kill_and_resume(computed_once: Any, fork_server: Any, tmp_path: Path, env: Dict[str, Optional[str]],
                    kill_at: int, checkpoint: str = "last.ckpt", status: int = KILLED, **options: Any
                     ) -> Dict[str, Any]:
    """The uninterrupted run, a run killed at step ``kill_at``, and its resume from ``checkpoint`` of its folder."""
    import torch

    config = {"augment": True, "epochs": 2, **options}
    # when and how the killed run writes its checkpoints does not change what the uninterrupted run trains: the runs
    # that differ only there share one uninterrupted run
    reference = reference_run(computed_once, fork_server, env,
                              {k: v for k, v in config.items() if k not in CHECKPOINTING_ONLY})
    run = {**config, "dirpath": str(tmp_path / "ckpts"), "logs": str(tmp_path / "logs")}
    run_config(fork_server, {**run, "out": str(tmp_path / "killed"), "kill_at_step": kill_at}, env, status=status)
    path = tmp_path / "ckpts" / checkpoint
    # plain `torch.load`, as torch 2.9 loads by default (weights only): the record is tensors, lists and numbers
    saved = torch.load(sharded_meta(path) if path.is_dir() else path, map_location="cpu")
    out = run_config(fork_server, {**run, "out": str(tmp_path / "resumed"), "ckpt_path": str(path)}, env, status=0)
    return {"reference": reference, "resumed": report_of(tmp_path / "resumed"), "output": out,
            "logged": logged_values(tmp_path / "logs"), "saved": saved}


def sharded_meta(path: Path) -> Path:
    """Of a sharded checkpoint (a directory of versions), the newest committed version's file of everything but the
    tensors (the record among it)."""
    from fsspec.core import url_to_fs

    from lightning_lite.strategies.xla_spmd import _SHARDED_META, _sharded_checkpoint_dir

    return Path(url_to_fs(_sharded_checkpoint_dir(str(path)))[1]) / _SHARDED_META


def check_exact(runs: Dict[str, Any], saved_at: Optional[int] = None, tolerance: float = 0.0, steps: int = 24) -> None:
    """The resumed run against the reference, from the step of the checkpoint it resumed (``saved_at``: the step it
    must be; ``None``: a checkpoint written in the background may not have reached the disk when the process was
    killed, and the one before it is resumed)."""
    reference, resumed = runs["reference"]["report"], runs["resumed"]
    _record_the_cell(runs)
    if saved_at is None:
        saved_at = runs["saved"]["global_step"]
    assert runs["saved"]["global_step"] == saved_at
    assert reference["global_step"] == len(reference["steps"]) == steps
    # the step count is exact: the resumed run trains every batch after the checkpoint once
    assert (resumed["status"], resumed["global_step"]) == ("finished", steps)
    assert [s["global_step"] for s in resumed["steps"]] == list(range(saved_at + 1, steps + 1))
    # the same batches, with the same noise, in the same order
    assert [s["rows"] for s in resumed["steps"]] == [s["rows"] for s in reference["steps"][saved_at:]]
    assert [s["inputs"] for s in resumed["steps"]] == [s["inputs"] for s in reference["steps"][saved_at:]]
    # the training thread draws what it drew
    assert resumed["draws"] == reference["draws"][saved_at:]
    assert resumed["rng_after"] == reference["rng_after"]
    assert [s["logger_step"] for s in resumed["steps"]] == [s["logger_step"] for s in reference["steps"][saved_at:]]
    # the same logged values at the same logger steps, from the checkpoint on (the values of the checkpoint's own
    # step logged before it was written are not logged again)
    logged = set(runs["logged"])
    reference_logged = {tuple(row) for row in runs["reference"]["logged"]}
    first_logged = min(step for step, _, _ in logged)
    assert logged <= reference_logged
    assert {row for row in reference_logged if row[0] > first_logged} <= logged
    assert "approximate" not in runs["output"]
    if tolerance:
        assert weights_diff(reference["weights"], resumed["weights"]) < tolerance
    else:
        assert resumed["weights"] == reference["weights"]
    if "module_state" in reference:
        # what the module and a callback keep in their own hooks: every hook of the saved batch or epoch end ran once,
        # and `training_epoch_end` saw every batch's output
        module, expected = resumed["module_state"], reference["module_state"]
        assert weights_diff({"w": module["weight_sum"]}, {"w": expected["weight_sum"]}) <= tolerance
        assert abs(module["epoch_losses"] - expected["epoch_losses"]) <= tolerance * 100
        assert resumed["callback_state"]["batches"] == reference["callback_state"]["batches"]
        assert resumed["callback_state"]["epoch_ends"] == reference["callback_state"]["epoch_ends"]
        assert abs(resumed["callback_state"]["loss_sum"] - reference["callback_state"]["loss_sum"]) <= tolerance * 100


def _record_the_cell(runs: Dict[str, Any]) -> None:
    """With ``EXACT_RESUME_REPORT=<file>``, append how far the resumed run ended from the uninterrupted one (a JSON
    line: the test, the step of the checkpoint, the resumed run's step count, the largest weight difference and that of
    the module's own state, whether the output said "approximate"), before anything is asserted: the matrix run on
    another tree (``PYTHONPATH=<its src>``) then gives each cell's numbers, failing or not."""
    path = os.environ.get("EXACT_RESUME_REPORT")
    if not path:
        return
    reference, resumed = runs["reference"]["report"], runs["resumed"]
    row = {
        "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
        "saved_step": runs["saved"].get("global_step"),
        "steps": [resumed.get("global_step"), reference.get("global_step")],
        "weights": weights_diff(reference["weights"], resumed["weights"]),
        "module_state": (
            weights_diff({"w": resumed["module_state"]["weight_sum"]}, {"w": reference["module_state"]["weight_sum"]})
            if "module_state" in reference and "module_state" in resumed else None
        ),
        "said_approximate": "approximate" in runs["output"],
    }
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def where_saved(saved: Dict[str, Any]) -> Tuple[int, str]:
    """Where the record says the checkpoint was written: ``ModelCheckpoint`` writes ``"between batches"`` (after the
    whole batch, its validation and its optimizer step) or at the ``"epoch end"`` (after every hook of it)."""
    record = saved["xla_preemption"]
    assert record["preempted"] is False
    if record["in_validation"]:
        return saved["global_step"], "validation end"
    if record["batch_end"]:
        return saved["global_step"], "batch end"
    return saved["global_step"], "epoch end" if record.get("epoch_end") else "between batches"


