"""A run killed without notice resumes exactly from the last checkpoint that ``fit`` wrote on XLA.

A real process trains (``helpers/preemption_runs.py`` with ``augment``: a shuffling loader whose dataset draws noise
from torch's, NumPy's and Python's global generators, a training step that draws from them too, dropout, momentum, a
per-step schedule, validation twice an epoch) and kills itself with ``SIGKILL`` at a chosen global step, as a host
failure or an OOM kill would. ``fit(ckpt_path=<last.ckpt>)`` then resumes from the last periodic checkpoint, and must
end where the uninterrupted run ends: the same batches with the same noise after the checkpoint, the same draws of
the training thread, the same logged values, the same step count and the same weights (bit for bit on one device).

Before, only the preemption checkpoint held where the epoch stood: a periodic checkpoint resumed from the epoch's
first batch with the random states of the new process, so it trained some batches twice, others never, and one step
too many.
"""
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import pytest

from helpers.exact_resume import (
    check_exact,
    KILLED,
    kill_and_resume,
    logged_values,
    reference_run,
    report_of,
    run_config,
    sharded_meta,
    SINGLE_ENV,
    SPAWN_ENV,
    SPMD_ENV,
    where_saved,
)
from helpers.runif import RunIf

FIXED_BY = "0071-feature-xla-exact-resume-from-every-checkpoint.patch"

# The resume matrix: every trigger a user saves from with `ModelCheckpoint` (the defaults first) x every strategy x
# `num_workers` 0 and 2, each cell a real `SIGKILL` (or, for the last epoch's checkpoint, a run that ended) and a resume
# compared with the uninterrupted run. The writes take each strategy's default (in the background); the kill lets them
# land first (`kill_after_writes`), so that the checkpoint resumed is the trigger's, whatever the host's load.
#
# A trigger, for `batches` batches an epoch (12 on one process, 6 each for the two `tpu_spawn` processes): its options
# and the run's, the step of the kill (None: the run of 2 epochs ends, then `max_epochs=3` resumes it), the checkpoint
# resumed, the step it holds, where the record says it was written, and the epochs of the run.
Trigger = Tuple[Dict[str, Any], Optional[int], str, int, str, int]


def trigger_row(trigger: str, batches: int) -> Trigger:
    half = batches // 2
    if trigger == "epoch end (default, validation once an epoch)":
        # ModelCheckpoint's default with validation once an epoch: `on_train_epoch_end`
        return {"val_check_interval": 1.0}, batches + half - 1, "last.ckpt", batches, "epoch end", 3
    if trigger == "epoch end (default, no validation)":
        # (1.8.6's ModelCheckpoint saves nothing at all without validation when `val_check_interval` is not 1.0)
        return ({"limit_val_batches": 0, "val_check_interval": 1.0}, batches + half - 1, "last.ckpt", batches,
                "epoch end", 3)
    if trigger == "validation end (default, validation twice an epoch)":
        # at the end of the validation in the middle of the second epoch
        return {}, batches + half + 1, "last.ckpt", batches + half, "between batches", 2
    if trigger == "every_n_epochs=1, save_on_train_epoch_end":
        return ({"every_n_epochs": 1, "save_on_train_epoch_end": True}, 2 * batches + half - 1,
                f"epoch=1-step={2 * batches}.ckpt", 2 * batches, "epoch end", 3)
    if trigger == "every_n_train_steps":
        # between two validations: after step 10 (of 12), after step 4 (of 6, validations after 3 and 6)
        every = batches // 3 + 1 if batches > 6 else 4
        saved = every * (batches // every)
        return {"every_n_train_steps": every}, saved + 1, "last.ckpt", saved, "between batches", 2
    if trigger == "train_time_interval":
        # on a clock of one second per batch, a save every 2 s: after step 8 (of 12), 4 (of 6), where no validation is
        saved = 2 * (half // 2) + 2
        return {"train_time_interval": 2}, saved + 1, "last.ckpt", saved, "between batches", 2
    if trigger == "the last epoch's, resumed with more epochs":
        return {"val_check_interval": 1.0}, None, "last.ckpt", 2 * batches, "epoch end", 3
    raise ValueError(trigger)


TRIGGERS = (
    "epoch end (default, validation once an epoch)",
    "epoch end (default, no validation)",
    "validation end (default, validation twice an epoch)",
    "every_n_epochs=1, save_on_train_epoch_end",
    "every_n_train_steps",
    "train_time_interval",
    "the last epoch's, resumed with more epochs",
)
# strategy -> (its environment, its options, the batches of an epoch, the exit status of the killed run, the weights'
# tolerance: the same sums in another order across devices)
STRATEGIES = {
    "one device": (SINGLE_ENV, {}, 12, KILLED, 0.0),
    # each process seeded differently (each draws its own noise and dropout); a killed process fails the launcher
    "tpu_spawn": (SPAWN_ENV, {"strategy": "tpu_spawn", "seed_by_rank": True}, 6, 1, 1e-6),
    "xla_spmd full": (SPMD_ENV, {"strategy": "xla_spmd"}, 12, KILLED, 1e-6),
    "xla_spmd sharded": (SPMD_ENV, {"strategy": "xla_spmd", "sharded": True}, 12, KILLED, 1e-6),
    "xla_spmd_fsdp full": (SPMD_ENV, {"strategy": "xla_spmd_fsdp"}, 12, KILLED, 1e-6),
    "xla_spmd_fsdp sharded": (SPMD_ENV, {"strategy": "xla_spmd_fsdp", "sharded": True}, 12, KILLED, 1e-6),
}
# the cells `make test` runs: every trigger on one device, the two defaults' neighbours on every strategy (the epoch end
# and a batch end), and workers with both; `make test-matrix` runs the rest (`full_matrix`)
QUICK = {(t, "one device", 0) for t in TRIGGERS} | {
    (t, s, 0) for t in ("epoch end (default, validation once an epoch)", "every_n_train_steps") for s in STRATEGIES
} | {(t, "one device", 2) for t in ("epoch end (default, validation once an epoch)", "every_n_train_steps")}
CELLS = [
    pytest.param(t, s, w, id=f"{t}-{s}-workers {w}",
                 marks=() if (t, s, w) in QUICK else (pytest.mark.full_matrix,))
    for t in TRIGGERS for s in STRATEGIES for w in (0, 2)
]


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("trigger, strategy, num_workers", CELLS)
def test_a_sigkill_resumes_exactly_from_every_trigger_on_every_strategy(tmp_path, computed_once, fork_server,
                                                                        trigger, strategy, num_workers):
    env, options, batches, status, tolerance = STRATEGIES[strategy]
    trigger_options, kill_at, checkpoint, saved_at, where, epochs = trigger_row(trigger, batches)
    config = {"num_workers": num_workers, "stateful": True, **options, **trigger_options}
    if kill_at is None:
        runs = _ended_then_resumed_with_more_epochs(computed_once, fork_server, tmp_path, env, config)
    else:
        runs = kill_and_resume(computed_once, fork_server, tmp_path, env, kill_at, checkpoint, status=status,
                               kill_after_writes=True, epochs=epochs, **config)
    check_exact(runs, saved_at, tolerance=tolerance, steps=batches * epochs)
    assert where_saved(runs["saved"]) == (saved_at, where)
    if strategy == "tpu_spawn":
        # each process gets its own states back
        assert sorted(runs["saved"]["xla_preemption"]["ranks"]) == [0, 1]
        rank1 = json.loads((tmp_path / "resumed" / "report-rank1.json").read_text())
        reference1 = runs["reference"]["rank1"]
        assert [s["rows"] for s in rank1["steps"]] == [s["rows"] for s in reference1["steps"][saved_at:]]
        assert rank1["draws"] == reference1["draws"][saved_at:]


def _ended_then_resumed_with_more_epochs(computed_once: Any, fork_server: Any, tmp_path: Path,
                                         env: Dict[str, Optional[str]], config: Dict[str, Any]) -> Dict[str, Any]:
    """A run of 2 epochs ends; its last checkpoint (the second epoch's end) resumed with ``max_epochs=3``, and the
    uninterrupted run of 3 epochs."""
    import torch

    config = {"augment": True, **config}
    reference = reference_run(computed_once, fork_server, env, {**config, "epochs": 3})
    run = {**config, "dirpath": str(tmp_path / "ckpts"), "logs": str(tmp_path / "logs")}
    run_config(fork_server, {**run, "epochs": 2, "out": str(tmp_path / "first")}, env, status=0)
    path = tmp_path / "ckpts" / "last.ckpt"
    saved = torch.load(sharded_meta(path) if path.is_dir() else path, map_location="cpu")
    out = run_config(fork_server, {**run, "epochs": 3, "out": str(tmp_path / "resumed"), "ckpt_path": str(path)},
                     env, status=0)
    return {"reference": reference, "resumed": report_of(tmp_path / "resumed"), "output": out,
            "logged": logged_values(tmp_path / "logs"), "saved": saved}


# where in an epoch `every_n_train_steps` and the validations' saves fall, on one device: (options, the kill's step,
# the checkpoint, the step it holds)
POSITIONS = {
    "validation end, mid-epoch": ({"every_n_train_steps": 5}, 8, "last.ckpt", 6),
    "every_n_train_steps, second epoch": ({"every_n_train_steps": 5}, 17, "last.ckpt", 15),
    # at the end of the batch after which a validation is due: the resumed run trains on after it
    "every_n_train_steps, with a validation due": ({"every_n_train_steps": 3}, 7, "epoch=0-step=6.ckpt", 6),
    # the epoch's last batch: the resumed run ends the epoch
    "every_n_train_steps, the epoch's last batch": ({"every_n_train_steps": 6}, 13, "epoch=0-step=12.ckpt", 12),
}


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("position", list(POSITIONS))
def test_a_sigkill_resumes_exactly_from_every_position_in_an_epoch(tmp_path, computed_once, fork_server, position):
    options, kill_at, checkpoint, saved_at = POSITIONS[position]
    # written before each save returns: the kill finds the checkpoint of the position under test
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, kill_at, checkpoint, num_workers=0,
                           background_writes=False, stateful=True, **options)
    check_exact(runs, saved_at)
    assert where_saved(runs["saved"]) == (saved_at, "between batches")


# the data users bring: two training loaders in a dict, and a stream that knows no length (`IterableDataset`), each at
# a batch end and at an epoch's end; and a time limit
LOADERS = {
    "two loaders, every 5": ({"loader": "two", "every_n_train_steps": 5}, 11, "last.ckpt", 10, "between batches"),
    "two loaders, epoch end": (
        {"loader": "two", "val_check_interval": 1.0, "epochs": 3}, 17, "last.ckpt", 12, "epoch end"),
    # (an int `val_check_interval`: Lightning refuses a fraction of an epoch it cannot count)
    "IterableDataset, every 5": ({"loader": "iterable", "every_n_train_steps": 5, "val_check_interval": 6}, 11,
                                 "last.ckpt", 10, "between batches"),
    "IterableDataset, epoch end": (
        {"loader": "iterable", "val_check_interval": 1.0, "epochs": 3}, 17, "last.ckpt", 12, "epoch end"),
    # `max_time`: its `Timer` keeps state in its own batch-end hook
    "max_time, every 5": ({"max_time": "00:01:00:00", "every_n_train_steps": 5}, 11, "last.ckpt", 10,
                          "between batches"),
}


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("case", list(LOADERS))
def test_a_sigkill_resumes_exactly_with_the_loaders_and_limits_users_bring(tmp_path, computed_once, fork_server, case):
    options, kill_at, checkpoint, saved_at, where = LOADERS[case]
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, kill_at, checkpoint, num_workers=0,
                           background_writes=False, stateful=True, **options)
    check_exact(runs, saved_at, steps=12 * options.get("epochs", 2))
    assert where_saved(runs["saved"]) == (saved_at, where)


@RunIf(xla=True)
@pytest.mark.slow
def test_a_save_decided_inside_an_accumulation_is_written_after_its_step(tmp_path, computed_once, fork_server):
    """``train_time_interval`` of 3 s on a clock of one second per batch, 2 batches an optimizer step: some saves are
    decided after the first batch of an accumulation. The file is written once the accumulation stepped, so the
    resume loses no accumulated gradient and ends at the uninterrupted run's weights."""
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, 9, "last.ckpt", num_workers=0,
                           train_time_interval=3, accumulate=2, background_writes=False, stateful=True)
    reference, resumed = runs["reference"]["report"], runs["resumed"]
    saved = runs["saved"]
    # decided after the 15th batch (the first of the 8th step), written after the 16th
    assert where_saved(saved) == (8, "between batches")
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["completed"] == 16 % 12
    assert (resumed["status"], resumed["global_step"]) == ("finished", reference["global_step"]) == ("finished", 12)
    assert resumed["weights"] == reference["weights"]
    assert resumed["module_state"] == reference["module_state"]
    assert resumed["callback_state"] == reference["callback_state"]
    assert "approximate" not in runs["output"]


def _boring_fit(tmp_path: Path, every_n_train_steps: Optional[int], ckpt_path: Optional[str] = None,
                batch_size: int = 2, max_epochs: int = 1, shuffle: bool = True) -> Any:
    """One XLA device in this process: a shuffling loader of 32 batches, checkpoints every ``every_n_train_steps``."""
    from torch.utils.data import DataLoader

    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Model(BoringModel):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=batch_size, shuffle=shuffle)

    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=max_epochs, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=every_n_train_steps,
                                                 save_top_k=-1)])
    trainer.fit(Model(), ckpt_path=ckpt_path)
    return trainer


@RunIf(xla=True)
def test_a_periodic_checkpoint_with_another_batch_size_is_refused(tmp_path):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    _boring_fit(tmp_path, every_n_train_steps=10)
    path = str(tmp_path / "ckpts" / "epoch=0-step=10.ckpt")
    with pytest.raises(MisconfigurationException) as refused:
        _boring_fit(tmp_path, every_n_train_steps=10, ckpt_path=path, batch_size=4)
    assert str(refused.value) == (
        f"The checkpoint {path} was written in an epoch of another training dataloader: the number of batches of the"
        " epoch 32 -> 16, length 32 -> 16, batch_size 2 -> 4. Resuming would skip the wrong batches. To resume, train"
        " with the dataloader it was written with; to start again instead, call `fit(..., ckpt_path=None)`."
    )
    # the same dataloader resumes, at the next unseen batch
    assert _boring_fit(tmp_path, every_n_train_steps=10, ckpt_path=path).global_step == 32


@RunIf(xla=True)
@pytest.mark.parametrize("step, mid_epoch", [(10, True), (32, False)])
def test_a_checkpoint_without_the_record_resumes_as_upstream_with_one_warning(tmp_path, step, mid_epoch):
    """A checkpoint of upstream 1.8.6 (here: one of the fork's, its record taken out) resumes as upstream resumes it,
    and says once that the resume is approximate, and why."""
    import warnings

    import torch

    _boring_fit(tmp_path, every_n_train_steps=step)
    path = tmp_path / "ckpts" / f"epoch=0-step={step}.ckpt"
    checkpoint = torch.load(path)
    del checkpoint["xla_preemption"]
    upstream = tmp_path / "upstream.ckpt"
    torch.save(checkpoint, upstream)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _boring_fit(tmp_path, every_n_train_steps=None, ckpt_path=str(upstream), max_epochs=2)
    approximate = [str(w.message) for w in caught if "approximate" in str(w.message)]
    assert len(approximate) == 1, approximate
    if mid_epoch:
        assert "holds no record of where the epoch stood" in approximate[0]
        # as upstream resumes it: the epoch's remaining count of batches from a new pass, counted from the last
        # completed batch (ModelCheckpoint writes on XLA once its batch is completed: no step too many)
        assert trainer.global_step == 64
    else:
        assert "holds no record of the random generators' states" in approximate[0]
        assert trainer.global_step == 64
    assert str(upstream) in approximate[0]
    # upstream's own first sentence, which filters may match, and not its advice (fault-tolerant training)
    assert approximate[0].startswith("You're resuming from a checkpoint that ended before") == mid_epoch
    assert not [w for w in caught if "fault_tolerant_training" in str(w.message)]


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_checkpoints_with_their_record_cost_the_steps_no_graph(computed_once, fork_server, strategy):
    """With a checkpoint every 5 steps (its record, its background write, written once the batch is over), a steady
    step still compiles nothing, executes one graph and reads one value (the logged loss); a step after a save adds
    the save's transfers (the state, the device's random seed) but no compilation and no execution. On every
    strategy. Under `tpu_spawn`, each process's counts, in the test harness that carries the collectives over gloo: a
    step is two executions and two reads there (the gradients' all-reduce between the backward and the optimizer step),
    and a save exchanges the processes' records, whose collectives compile at the first save only; what they execute
    is the harness's (the Cloud TPU VM workflow runs the processes on a TPU)."""
    env, options, batches, _, _ = STRATEGIES[strategy]
    run = reference_run(computed_once, fork_server, env, {"augment": True, "epochs": 2, "num_workers": 0,
                                                          "every_n_train_steps": 5, **options})
    for report in filter(None, (run["report"], run["rank1"])):
        steps = report["steps"]
        after_save, steady = [], []
        for before, now in zip(steps, steps[1:]):
            k = before["global_step"]
            counts = [now[c] - before[c] for c in ("compiles", "executions", "transfers")]
            if k % (batches // 2) == 0 or k < 3:  # a validation ran after step k, or still warming up
                continue
            (after_save if k % 5 == 0 else steady).append(counts)
        executions = 2 if strategy == "tpu_spawn" else 1
        assert steady and all(c[0] == 0 and c[1] == executions and c[2] <= executions for c in steady), steady
        if strategy == "tpu_spawn":
            assert len(after_save) == 2 and after_save[1][0] == 0, after_save
        else:
            assert after_save and all(c[0] == 0 and c[1] == executions for c in after_save), after_save


@RunIf(xla=True)
@pytest.mark.parametrize("mode", ["1", "2"])
def test_fault_tolerant_training_is_refused_on_xla_before_anything_runs(tmp_path, monkeypatch, mode):
    """1.8.6's fault-tolerant mode resumes approximately on XLA: ``fit`` refuses it before it trains or writes anything
    (its exception handler would save a checkpoint), says what resumes exactly instead, and runs once it is unset."""
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    monkeypatch.setenv("PL_FAULT_TOLERANT_TRAINING", mode)
    with pytest.raises(MisconfigurationException) as refused:
        _boring_fit(tmp_path, every_n_train_steps=10, shuffle=False)
    assert str(refused.value).startswith(f"`PL_FAULT_TOLERANT_TRAINING={mode}` turns on Lightning 1.8.6's")
    assert "Unset `PL_FAULT_TOLERANT_TRAINING` and resume with `trainer.fit(model, ckpt_path=...)`." in str(refused.value)
    assert sorted(p.name for p in tmp_path.rglob("*")) == []
    monkeypatch.delenv("PL_FAULT_TOLERANT_TRAINING")
    assert _boring_fit(tmp_path, every_n_train_steps=10, shuffle=False).global_step == 32


# the CPU kept the mode before too: this guards it
@pytest.mark.guard
def test_fault_tolerant_training_still_runs_off_xla(tmp_path, monkeypatch):
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    monkeypatch.setenv("PL_FAULT_TOLERANT_TRAINING", "1")
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=2, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(BoringModel())
    assert trainer.global_step == 2


@RunIf(xla=True)
def test_epoch_outputs_with_numpy_arrays_stay_out_of_the_record(tmp_path):
    """A ``training_step`` that returns a NumPy array beside its loss, with ``training_epoch_end`` overridden: the
    record keeps no outputs it could not load back (torch's safe unpickler refuses NumPy arrays), so plain
    ``torch.load`` reads the checkpoint and ``fit`` resumes from it; outputs of tensors alone are kept."""
    import torch
    from torch.utils.data import DataLoader

    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Model(BoringModel):
        def __init__(self, with_numpy: bool) -> None:
            super().__init__()
            self.with_numpy = with_numpy

        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            if self.with_numpy:
                out["pred"] = out["loss"].detach().cpu().numpy()
            return out

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 32), batch_size=2)

    for with_numpy in (True, False):
        folder = tmp_path / str(with_numpy)

        def fit(ckpt_path=None, steps=6):
            trainer = Trainer(accelerator="tpu", devices=1, max_steps=steps, limit_val_batches=0, logger=False,
                              enable_progress_bar=False, enable_model_summary=False, default_root_dir=folder,
                              callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=3, save_top_k=-1)])
            trainer.fit(Model(with_numpy), ckpt_path=ckpt_path)
            return trainer

        fit()
        path = folder / "epoch=0-step=3.ckpt"
        ranks = torch.load(path)["xla_preemption"]["ranks"]
        assert ("epoch_outputs" in ranks[0]) is not with_numpy
        assert fit(ckpt_path=str(path), steps=8).global_step == 8
