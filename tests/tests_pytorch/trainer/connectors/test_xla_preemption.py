"""A spot TPU VM's ``SIGTERM`` loses no completed step: the run saves at a step every process agrees on and exits with
status 75 (``EX_TEMPFAIL``, so that a scheduler starts it again; ``PL_XLA_PREEMPTION_EXIT_STATUS`` chooses another),
and the same command with ``fit(ckpt_path="last")`` ends at the weights of an uninterrupted run.

Every run is a real training process (``helpers/preemption_runs.py``) that a real ``SIGTERM`` interrupts, sent from
inside the run at a chosen global step so that the step is known. The model has dropout, the loader shuffles, the
optimizer has momentum and a per-step schedule, and validation runs twice an epoch: a resume that loses a random
state, a batch, a piece of the optimizer's or a callback's state does not reproduce the reference.

Each process is forked from an interpreter that imported torch, torch_xla and Lightning once, one per environment
(``helpers/fork_server.py``), so that the ~40 runs do not each pay for the imports; the uninterrupted reference runs
are made once per session (the ``computed_once`` fixture of ``tests/conftest.py``) and shared by both pytest-xdist
workers.
"""
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from helpers.preemption_runs import AFTER_FIT, weights_diff
from helpers.runif import RunIf

FIXED_BY = "0057-feature-xla-preemption.patch"

SAVED = re.compile(r"SIGTERM: saved the run after global step (\d+) to (\S+); exiting with status (\d+)\.")
#: the exit status of a preempted run unless the user chose another
PREEMPTED = 75
RUNTIME_VARIABLES = ("PJRT_DEVICE", "CPU_NUM_DEVICES")


def _run(fork_server: Any, config: Dict[str, Any], env: Dict[str, Optional[str]],
         timeout: float = 420) -> subprocess.CompletedProcess:
    """One training process, forked from the preloaded interpreter of ``env``: a session of its own (so that a signal
    to its process group stays inside it) with ``SIGTERM`` at its default action; the runner may have SIGINT ignored,
    the child resets it itself (``preemption_runs.main``).

    The variables the XLA runtime reads when it starts (the device kind and count) make the server's environment;
    the others (Lightning's, the bucket's) are read when used, and the child sets them itself, so that the runs of a
    device setup share one server."""
    server_env = {k: v for k, v in env.items() if k in RUNTIME_VARIABLES}
    child_env = {k: v for k, v in env.items() if k not in RUNTIME_VARIABLES}
    assert None not in child_env.values(), child_env
    code = ("import json, os, sys\nos.environ.update(json.loads(sys.argv[2]))\n"
            "from helpers.preemption_runs import main\nmain(json.loads(sys.argv[1]))")
    return fork_server(server_env).run(code, [json.dumps(config), json.dumps(child_env)], timeout=timeout)


def _check(proc: subprocess.CompletedProcess, status: int = 0) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, f"exit status {proc.returncode}, not {status}\n{out[-6000:]}"
    return out


def _exists(path: str) -> bool:
    from fsspec.core import url_to_fs

    fs, local = url_to_fs(path)
    fs.invalidate_cache()
    return fs.exists(local)


def _logged_steps(folder: Path) -> List[int]:
    with open(folder / "logs" / "run" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return sorted({int(row["step"]) for row in rows if row.get("train_loss")})


def _report(folder: Path, rank: int = 0) -> Dict[str, Any]:
    return json.loads((folder / f"report-rank{rank}.json").read_text())


def _preempt_and_resume(
    fork_server: Any, tmp_path: Path, strategy: str, env: Dict[str, Optional[str]], signal_at: int, ranks: int = 1,
    **signal: Any
) -> Dict[str, Any]:
    """Train until the signal, then resume with the same command; return what both runs reported."""
    folder = tmp_path / f"step{signal_at}-{signal.get('signal_to', 'self')}"
    dirpath = signal.pop("dirpath", str(folder / "checkpoints"))
    config = {
        "strategy": strategy,
        "dirpath": dirpath,
        "logs": str(folder / "logs"),
        "signal_at_step": signal_at,
        **signal,
    }
    # the scheduler is told to start the command again
    first = _check(_run(fork_server, {**config, "out": str(folder / "first")}, env), status=PREEMPTED)
    saved = SAVED.findall(first)
    assert len(saved) == 1, first[-3000:]
    step, path = int(saved[0][0]), saved[0][1]
    assert int(saved[0][2]) == PREEMPTED
    assert "Traceback" not in first
    # the VM is going away: the user's code after `fit` does not run
    assert AFTER_FIT not in first
    assert path == f"{dirpath}/last-preempted.ckpt"
    assert _exists(path)
    first_reports = [_report(folder / "first", r) for r in range(ranks)]
    # the logger was flushed: the loss of every batch trained, at its step
    assert _logged_steps(folder) == sorted({s["logger_step"] for s in first_reports[0]["steps"]})
    second = _check(_run(fork_server, {**config, "out": str(folder / "second"), "resume": True, "signal_at_step": None,
                                       "signal_at_batch": None, "signal_in_validation": None}, env))
    assert f"Restored all states from the checkpoint file at {path}" in second
    assert AFTER_FIT in second
    # a finished run leaves no preemption checkpoint for a later `ckpt_path="last"` to go back to
    assert not _exists(path)
    second_reports = [_report(folder / "second", r) for r in range(ranks)]
    if second_reports[0]["steps"]:
        # the resumed run logs the steps after it, numbered on (its logger rewrote the same CSV file)
        assert _logged_steps(folder) == sorted({s["logger_step"] for s in second_reports[0]["steps"]})
    return {
        "step": step,
        "output": first,
        "first": first_reports,
        "second": second_reports,
    }


def _reference(computed_once: Any, fork_server: Any, name: str, strategy: str, env: Dict[str, Optional[str]],
               ranks: int = 1, **options: Any) -> List[Dict]:
    """What the uninterrupted run of ``strategy`` (with ``options``) reported, made once per session."""

    def run(folder: Path) -> List[Dict]:
        config = {"strategy": strategy, "dirpath": str(folder / "checkpoints"), "logs": str(folder / "logs"), **options}
        _check(_run(fork_server, {**config, "out": str(folder / "run")}, env))
        return [_report(folder / "run", r) for r in range(ranks)]

    return computed_once(f"preemption-reference-{name}", run)


def _assert_nothing_lost(reference: Dict[str, Any], first: Dict[str, Any], second: Dict[str, Any], step: int) -> None:
    assert first["status"] == "XLAPreempted" and second["status"] == "finished"
    assert first["global_step"] == step
    # every batch of the reference, in its order, trained exactly once: before the signal or after the resume
    key = ("global_step", "epoch", "batch_idx", "rows", "logger_step", "bar")
    expected = [[s[k] for k in key] for s in reference["steps"]]
    got = [[s[k] for k in key] for s in first["steps"] + second["steps"]]
    assert got == expected
    assert second["top_k"] == reference["top_k"]


@pytest.fixture(scope="module")
def single_reference(computed_once, fork_server):
    return _reference(computed_once, fork_server, "single", "single", {"PJRT_DEVICE": "CPU"})[0]


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("signal_at", [2, 12, 24])
def test_single_device_sigterm_resumes_bit_identical(tmp_path, fork_server, single_reference, signal_at):
    runs = _preempt_and_resume(fork_server, tmp_path, "single", {"PJRT_DEVICE": "CPU"}, signal_at)
    # one process: it stops after the step in flight
    assert runs["step"] == signal_at
    _assert_nothing_lost(single_reference, runs["first"][0], runs["second"][0], signal_at)
    assert runs["second"][0]["weights"] == single_reference["weights"]
    # the random generators continue as if nothing had happened
    assert runs["second"][0]["rng_after"] == single_reference["rng_after"]


def _steady_counts(report: Dict[str, Any]) -> List[Dict[str, int]]:
    """Compilations, executions and transfers of every step that follows a step of the same epoch without
    validation or a checkpoint in between (validation runs after batch 5 and at the end of each epoch)."""
    steps = report["steps"]
    return [
        {k: b[k] - a[k] for k in ("compiles", "executions", "transfers")}
        for a, b in zip(steps, steps[1:])
        if a["epoch"] == b["epoch"] and a["batch_idx"] != 5 and b["batch_idx"] > 1
    ]


@pytest.fixture(scope="module")
def accumulate_reference(computed_once, fork_server):
    return _reference(computed_once, fork_server, "accumulate", "single", {"PJRT_DEVICE": "CPU"}, accumulate=2)[0]


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("signal_at_batch, stops_at_step", [(6, 3), (7, 4)])
def test_accumulating_gradients_stops_after_a_step(tmp_path, fork_server, accumulate_reference, signal_at_batch,
                                                   stops_at_step):
    """With ``accumulate_grad_batches=2`` the run stops only after a batch that steps the optimizer: a signal during
    the 7th batch (which accumulates) stops it after the 8th, and no accumulated gradient is lost."""
    env = {"PJRT_DEVICE": "CPU"}
    reference = accumulate_reference
    runs = _preempt_and_resume(fork_server, tmp_path, "single", env, signal_at=-1, signal_at_batch=signal_at_batch,
                               accumulate=2)
    assert runs["step"] == stops_at_step
    assert len(runs["first"][0]["steps"]) == 2 * stops_at_step
    _assert_nothing_lost(reference, runs["first"][0], runs["second"][0], stops_at_step)
    assert runs["second"][0]["weights"] == reference["weights"]


@RunIf(xla=True)
@pytest.mark.slow
def test_manual_optimization_with_two_optimizers_resumes_bit_identical(tmp_path, computed_once, fork_server):
    """Two optimizers stepped by hand (Adam's moments included) and a torchmetrics metric in ``self.log``."""
    env = {"PJRT_DEVICE": "CPU"}
    reference = _reference(computed_once, fork_server, "manual", "single", env, manual=True)[0]
    runs = _preempt_and_resume(fork_server, tmp_path, "single", env, signal_at=-1, signal_at_batch=9, manual=True)
    # two optimizer steps a batch: the global step counts both
    assert runs["step"] == 18
    _assert_nothing_lost(reference, runs["first"][0], runs["second"][0], 18)
    assert runs["second"][0]["weights"] == reference["weights"]


@RunIf(xla=True)
@pytest.mark.slow
# a guard: a run without the feature costs the same; this keeps the watching from adding a graph or a transfer
@pytest.mark.guard
def test_watching_for_sigterm_costs_no_graph_and_no_transfer(single_reference):
    counts = _steady_counts(single_reference)
    assert len(counts) >= 10
    assert counts == [{"compiles": 0, "executions": 1, "transfers": 1}] * len(counts)


SPMD_ENV = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}


@pytest.fixture(scope="module")
def spmd_references(computed_once, fork_server):
    return {strategy: _reference(computed_once, fork_server, strategy, strategy, SPMD_ENV)[0]
            for strategy in ("xla_spmd", "xla_spmd_fsdp")}


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
def test_spmd_sigterm_resumes_where_it_stopped(tmp_path, fork_server, spmd_references, strategy):
    reference = spmd_references[strategy]
    counts = _steady_counts(reference)
    assert counts == [{"compiles": 0, "executions": 1, "transfers": 1}] * len(counts)
    # the two strategies share the agreement and the save: between them, a signal in each epoch
    for signal_at in (4, 13) if strategy == "xla_spmd" else (9,):
        runs = _preempt_and_resume(fork_server, tmp_path, strategy, SPMD_ENV, signal_at)
        assert runs["step"] == signal_at
        _assert_nothing_lost(reference, runs["first"][0], runs["second"][0], signal_at)
        diff = weights_diff(reference["weights"], runs["second"][0]["weights"])
        assert diff < 1e-6


# two processes through the simulated TPU host of `helpers/gloo_xla_collectives.py`, as `tpu_spawn` runs on a VM
SPAWN_ENV = {"PJRT_DEVICE": None, "CPU_NUM_DEVICES": None}


@pytest.fixture(scope="module")
def spawn_reference(computed_once, fork_server):
    return _reference(computed_once, fork_server, "tpu_spawn", "tpu_spawn", SPAWN_ENV, ranks=2)


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize(
    "signal_at, signal",
    [
        # one rank only: the other learns of it through the agreement and stops at the same step
        pytest.param(2, {"signal_to": "self", "signal_rank": 1}, id="rank1-only"),
        pytest.param(8, {"signal_to": "self", "signal_rank": 0}, id="rank0-only"),
        # the launcher's main process: it sends the signal on to every rank
        pytest.param(4, {"signal_to": "main", "signal_rank": 1}, id="main-process"),
        # every process of the run at once, as a VM's shutdown does
        pytest.param(5, {"signal_to": "group", "signal_rank": 1}, id="every-process"),
        pytest.param(7, {"signal_to": "group", "signal_rank": 0}, id="every-process-epoch-2"),
    ],
)
def test_two_processes_stop_at_one_step_and_resume(tmp_path, fork_server, spawn_reference, signal_at, signal):
    runs = _preempt_and_resume(fork_server, tmp_path, "tpu_spawn", SPAWN_ENV, signal_at, ranks=2, **signal)
    # the save starts within two steps of the signal
    assert signal_at <= runs["step"] <= signal_at + 2
    # the launcher's main process ends with the workers' status and one line, without a traceback
    assert runs["output"].count("The 2 processes of this host stopped on SIGTERM and saved") == 1
    assert f"; exiting with status {PREEMPTED}.\n" in runs["output"]
    for rank in (0, 1):
        first, second = runs["first"][rank], runs["second"][rank]
        _assert_nothing_lost(spawn_reference[rank], first, second, runs["step"])
        diff = weights_diff(spawn_reference[rank]["weights"], second["weights"])
        assert diff < 1e-6


@RunIf(xla=True)
@pytest.mark.slow
# a guard: 1.8.6 started fresh too; `ckpt_path="last"` on every start must keep doing so
@pytest.mark.guard
def test_resume_without_a_preemption_checkpoint_starts_fresh(tmp_path, fork_server, single_reference):
    """The same command before any preemption: ``ckpt_path="last"`` finds nothing and trains from the start."""
    folder = tmp_path / "fresh"
    config = {"strategy": "single", "dirpath": str(folder / "checkpoints"), "logs": str(folder / "logs"),
              "out": str(folder / "run"), "resume": True}
    out = _check(_run(fork_server, config, {"PJRT_DEVICE": "CPU"}))
    assert "No checkpoint will be loaded" in out
    assert _report(folder / "run")["weights"] == single_reference["weights"]


@RunIf(xla=True)
@pytest.mark.slow
def test_a_preemption_saves_to_object_storage_and_resumes_from_it(tmp_path, fork_server, single_reference, gcs_bucket,
                                                                   gcs_env):
    """The checkpoint folder is a ``gs://`` URL (a GCS emulator): the preemption checkpoint goes there, and the
    resume finds it with ``ckpt_path="last"``, ends at the reference weights and removes it."""
    env = {"PJRT_DEVICE": "CPU", **gcs_env}
    runs = _preempt_and_resume(fork_server, tmp_path, "single", env, 9, dirpath=f"{gcs_bucket}/run")
    _assert_nothing_lost(single_reference, runs["first"][0], runs["second"][0], 9)
    assert runs["second"][0]["weights"] == single_reference["weights"]


@RunIf(xla=True)
@pytest.mark.slow
def test_a_sharded_preemption_checkpoint_in_object_storage(tmp_path, fork_server, spmd_references, gcs_bucket,
                                                           gcs_env):
    """FSDPv2 on 4 devices with ``state_dict_type="sharded"``: the preemption checkpoint is a committed version of
    shards in the bucket, and the resume reads it back."""
    env = {**SPMD_ENV, **gcs_env}
    reference = spmd_references["xla_spmd_fsdp"]
    runs = _preempt_and_resume(fork_server, tmp_path, "xla_spmd_fsdp", env, 7, dirpath=f"{gcs_bucket}/run",
                               sharded=True)
    _assert_nothing_lost(reference, runs["first"][0], runs["second"][0], 7)
    diff = weights_diff(reference["weights"], runs["second"][0]["weights"])
    assert diff < 1e-6


def _preempted_once(fork_server: Any, folder: Path, strategy: str, env: Dict[str, Optional[str]], status: int,
                    signal_at: int = 2, **options: Any) -> str:
    """A run that a ``SIGTERM`` to its process group stops at ``signal_at``; checks that it exits with ``status``."""
    config = {"strategy": strategy, "dirpath": str(folder / "checkpoints"), "logs": str(folder / "logs"),
              "out": str(folder / "first"), "signal_at_step": signal_at, "signal_to": "group", **options}
    out = _check(_run(fork_server, config, env), status=status)
    saved = SAVED.findall(out)
    assert [(path, int(said)) for _, path, said in saved] == [(f"{folder / 'checkpoints'}/last-preempted.ckpt", status)]
    # within two steps of the signal (several processes agree on one)
    assert signal_at <= int(saved[0][0]) <= signal_at + 2
    assert _report(folder / "first")["status"] == "XLAPreempted"
    assert AFTER_FIT not in out and "Traceback" not in out
    return out


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, env, chosen",
    [
        # 0 gives back the status of a finished run, as before
        pytest.param("single", {"PJRT_DEVICE": "CPU"}, "0", id="single-0", marks=pytest.mark.guard),
        pytest.param("xla_spmd", SPMD_ENV, "3", id="xla_spmd-3"),
        # the launcher's main process exits with the status its workers chose
        pytest.param("tpu_spawn", SPAWN_ENV, "42", id="tpu_spawn-42"),
    ],
)
def test_the_exit_status_of_a_preempted_run_can_be_chosen(tmp_path, fork_server, strategy, env, chosen):
    out = _preempted_once(fork_server, tmp_path, strategy, {**env, "PL_XLA_PREEMPTION_EXIT_STATUS": chosen},
                          int(chosen))
    if strategy == "tpu_spawn":
        assert f"The 2 processes of this host stopped on SIGTERM and saved {tmp_path / 'checkpoints'}" in out
        assert f"; exiting with status {chosen}.\n" in out


@RunIf(xla=True)
@pytest.mark.parametrize("value", ["seventy-five", "256", "-1", "1.5"])
def test_a_bad_exit_status_is_refused_when_fit_starts(tmp_path, monkeypatch, value):
    import signal

    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    monkeypatch.setenv("PL_XLA_PREEMPTION_EXIT_STATUS", value)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        trainer = Trainer(accelerator="tpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, default_root_dir=tmp_path)
        with pytest.raises(MisconfigurationException) as refused:
            trainer.fit(BoringModel())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert str(refused.value) == (
        f"PL_XLA_PREEMPTION_EXIT_STATUS={value!r}: the exit status of a run preempted by SIGTERM must be an integer from"
        " 0 to 255 (default 75, 0 for the status of a finished run)."
    )
    assert trainer.global_step == 0


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("step, val_batch", [(6, 0), (12, 1)])
def test_a_sigterm_during_validation_stops_it_and_the_resume_validates_again(tmp_path, fork_server, single_reference,
                                                                            step, val_batch):
    """Validation runs after global steps 6, 12, 18 and 24, three batches each. A ``SIGTERM`` during one stops it at
    its next batch and saves the state of the last training step; the resumed run makes that validation again, and
    ends where an uninterrupted run ends."""
    runs = _preempt_and_resume(fork_server, tmp_path, "single", {"PJRT_DEVICE": "CPU"}, signal_at=-1,
                               signal_in_validation=[step, val_batch])
    assert runs["step"] == step
    first, second = runs["first"][0], runs["second"][0]
    _assert_nothing_lost(single_reference, first, second, step)
    assert second["weights"] == single_reference["weights"]
    assert second["rng_after"] == single_reference["rng_after"]
    # the interrupted validation stopped after the batch in flight, and ran again in full
    assert first["val_batches"][-1] == [step, val_batch]
    assert [b for b in first["val_batches"] if b[0] < step] + second["val_batches"] == single_reference["val_batches"]


@RunIf(xla=True)
@pytest.mark.slow
def test_two_processes_stop_in_a_validation_together(tmp_path, fork_server, spawn_reference):
    """``tpu_spawn`` on two processes: validation runs after global steps 3, 6, 9 and 12, two batches a process. A
    ``SIGTERM`` to rank 1 during the validation after step 6 stops both processes at the same point (that validation's
    second batch, or the step after it), and the resumed runs end where uninterrupted ones end."""
    runs = _preempt_and_resume(fork_server, tmp_path, "tpu_spawn", SPAWN_ENV, signal_at=-1, ranks=2,
                               signal_in_validation=[6, 0], signal_rank=1)
    assert runs["step"] in (6, 7)
    for rank in (0, 1):
        first, second = runs["first"][rank], runs["second"][rank]
        _assert_nothing_lost(spawn_reference[rank], first, second, runs["step"])
        diff = weights_diff(spawn_reference[rank]["weights"], second["weights"])
        assert diff < 1e-6
        # a validation cut short runs again in full in the resumed run
        redone = second["val_batches"][:1] == [[runs["step"], 0]]
        kept = [b for b in first["val_batches"] if not (redone and b[0] == runs["step"])]
        assert kept + second["val_batches"] == spawn_reference[rank]["val_batches"]


@RunIf(xla=True)
@pytest.mark.slow
def test_spmd_stops_in_a_validation_and_validates_again(tmp_path, fork_server, spmd_references):
    reference = spmd_references["xla_spmd"]
    runs = _preempt_and_resume(fork_server, tmp_path, "xla_spmd", SPMD_ENV, signal_at=-1, signal_in_validation=[12, 1])
    assert runs["step"] == 12
    first, second = runs["first"][0], runs["second"][0]
    _assert_nothing_lost(reference, first, second, 12)
    diff = weights_diff(reference["weights"], second["weights"])
    assert diff < 1e-6
    assert first["val_batches"][-1] == [12, 1]
    assert [b for b in first["val_batches"] if b[0] < 12] + second["val_batches"] == reference["val_batches"]


def _plain_load(path: Path) -> subprocess.CompletedProcess:
    """``torch.load(path)`` in a fresh interpreter, as a user takes a state dict into plain PyTorch: torch's defaults,
    nothing of Lightning imported, no variable that changes what ``torch.load`` accepts."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    code = ("import sys, torch\nckpt = torch.load(sys.argv[1])\n"
            "print(sorted(ckpt), sorted(ckpt['state_dict']))")
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env,
                          timeout=300)


@RunIf(xla=True)
@pytest.mark.slow
def test_a_preemption_checkpoint_loads_with_plain_torch_load(tmp_path, fork_server):
    _preempted_once(fork_server, tmp_path, "single", {"PJRT_DEVICE": "CPU"}, PREEMPTED)
    proc = _plain_load(tmp_path / "checkpoints" / "last-preempted.ckpt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "'xla_preemption'" in proc.stdout and "'state_dict'" in proc.stdout
