"""A resumed run with random augmentations ends where the uninterrupted run ends: bit for bit on one device, within
float tolerance with two ``tpu_spawn`` processes and under SPMD, whatever ``batches_ahead`` and with or without
dataloader workers.

The training dataset draws noise from torch's, NumPy's and Python's global generators in ``__getitem__``, the loader
shuffles, and the training step draws from the same generators on the training thread (``helpers/preemption_runs.py``
with ``augment``). A real ``SIGTERM`` stops the run after step 5 of 12; the resumed run must train every later batch
with the noise the uninterrupted run gave it (its weights), and the training thread must draw what the uninterrupted
run drew (its ``draws``). Before, the loops had loaded the batches after step 5 (the data fetcher's one, and the
loader thread's ``batches_ahead``) when the states were saved, so the resumed run loaded them again from later
states; and only rank 0's states were saved, so every ``tpu_spawn`` process resumed with rank 0's.
"""
import json
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from helpers.preemption_runs import weights_diff
from helpers.runif import RunIf

FIXED_BY = "0057-feature-xla-preemption.patch"

SIGNAL_AT = 5
PREEMPTED = 75
SINGLE_ENV = {"PJRT_DEVICE": "CPU"}
SPMD_ENV = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}
# two processes through the simulated TPU host of `helpers/gloo_xla_collectives.py`
SPAWN_ENV = {"PJRT_DEVICE": None, "CPU_NUM_DEVICES": None}


def _run(fork_server: Any, config: Dict[str, Any], env: Dict[str, Optional[str]], status: int) -> None:
    code = "import json, sys\nfrom helpers.preemption_runs import main\nmain(json.loads(sys.argv[1]))"
    proc: subprocess.CompletedProcess = fork_server(env).run(code, [json.dumps(config)], timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, f"exit status {proc.returncode}, not {status}\n{out[-6000:]}"


def _reports(folder: Path, ranks: int) -> List[Dict[str, Any]]:
    return [json.loads((folder / f"report-rank{r}.json").read_text()) for r in range(ranks)]


def _runs(fork_server: Any, tmp_path: Path, strategy: str, env: Dict[str, Optional[str]], ranks: int,
          signal_at: int = SIGNAL_AT, in_validation: bool = False, **options: Any) -> Dict[str, List[Dict[str, Any]]]:
    """The uninterrupted run, the run that a ``SIGTERM`` to its processes stops after step ``signal_at`` (or, with
    ``in_validation``, in the first batch of the validation after it), and its resume."""
    config = {"strategy": strategy, "augment": True, "logs": str(tmp_path / "logs"), **options}
    _run(fork_server, {**config, "dirpath": str(tmp_path / "reference-ckpts"), "out": str(tmp_path / "reference")},
         env, status=0)
    preempted = {**config, "dirpath": str(tmp_path / "ckpts")}
    signal = {"signal_in_validation": [signal_at, 0]} if in_validation else {"signal_at_step": signal_at}
    _run(fork_server, {**preempted, "out": str(tmp_path / "first"), "signal_to": "group", **signal}, env,
         status=PREEMPTED)
    _run(fork_server, {**preempted, "out": str(tmp_path / "second"), "resume": True}, env, status=0)
    return {name: _reports(tmp_path / name, ranks) for name in ("reference", "first", "second")}


def _check(runs: Dict[str, List[Dict[str, Any]]], tolerance: float, signal_at: int = SIGNAL_AT) -> None:
    # one process stops after the step in flight; two agree on a step at most two after the signal
    stop = runs["first"][0]["global_step"]
    assert signal_at <= stop <= signal_at + (2 if len(runs["first"]) > 1 else 0)
    steps = runs["reference"][0]["global_step"]
    assert stop < steps == len(runs["reference"][0]["steps"])
    for rank, reference in enumerate(runs["reference"]):
        first, second = runs["first"][rank], runs["second"][rank]
        assert (first["status"], first["global_step"]) == ("XLAPreempted", stop)
        assert (second["status"], second["global_step"]) == ("finished", steps)
        # every batch once, in the reference's order
        assert [s["rows"] for s in first["steps"] + second["steps"]] == [s["rows"] for s in reference["steps"]]
        # the training thread draws what it drew in the uninterrupted run, from this rank's own generators
        assert second["draws"] == reference["draws"][stop:]
        assert second["rng_after"] == reference["rng_after"]
        # the batches after the stop got the noise they got in the uninterrupted run
        assert [s["inputs"] for s in first["steps"] + second["steps"]] == [s["inputs"] for s in reference["steps"]]
        if tolerance:
            diff = weights_diff(reference["weights"], second["weights"])
            assert diff < tolerance
        else:
            assert second["weights"] == reference["weights"]


@RunIf(xla=True)
@pytest.mark.slow
# the loops load `batches_ahead` batches beyond the one they train, between the training thread's draws; with 1, the
# signal comes in the validation after step 6, which the resumed run makes again before it loads the next batch
@pytest.mark.parametrize(
    "batches_ahead, signal_at, in_validation",
    [
        # without a loader thread nothing was loaded beyond the step at the stop: this resumed exactly before too
        pytest.param(0, 5, False, marks=pytest.mark.guard),
        (1, 6, True),
        (2, 5, False),
    ],
)
def test_one_device_resumes_bit_identical_whatever_the_look_ahead(tmp_path, fork_server, batches_ahead, signal_at,
                                                                   in_validation):
    runs = _runs(fork_server, tmp_path, "single", SINGLE_ENV, 1, signal_at=signal_at, in_validation=in_validation,
                 num_workers=0, batches_ahead=batches_ahead)
    _check(runs, tolerance=0, signal_at=signal_at)


@RunIf(xla=True)
@pytest.mark.slow
def test_two_processes_seeded_differently_resume_with_their_own_states(tmp_path, fork_server):
    # each process trains 6 batches of the 12
    runs = _runs(fork_server, tmp_path, "tpu_spawn", SPAWN_ENV, 2, signal_at=2, num_workers=0, seed_by_rank=True)
    # the processes do draw differently
    assert runs["reference"][0]["draws"] != runs["reference"][1]["draws"]
    _check(runs, tolerance=1e-6, signal_at=2)


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize(
    "num_workers",
    [
        0,
        # workers draw from generators of their own, seeded as the pass starts: this resumed exactly before too
        pytest.param(2, marks=pytest.mark.guard),
    ],
)
def test_spmd_resumes_where_it_stopped(tmp_path, fork_server, num_workers):
    runs = _runs(fork_server, tmp_path, "xla_spmd", SPMD_ENV, 1, num_workers=num_workers)
    _check(runs, tolerance=1e-6)


def test_the_recorded_loads_pickle_with_the_trainer():
    """``torch.save(trainer)`` pickles the training loop's fetcher with its recorded loads: unpickling must not reach
    into attributes that are not set yet (upstream's ``test_torch_saving.py::test_model_torch_save`` on XLA)."""
    import pickle

    from pytorch_lightning.trainer.connectors.xla_preemption import _PassLoads

    loads = pickle.loads(pickle.dumps(_PassLoads(iter([1, 2, 3]), first=0, record=False)))
    assert loads.next_index == 0 and list(loads) == [1, 2, 3]
