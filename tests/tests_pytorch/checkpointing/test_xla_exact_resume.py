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
from typing import Any, Optional

import pytest

from helpers.exact_resume import (
    check_exact,
    kill_and_resume,
    logged_values,
    reference_run,
    report_of,
    run_config,
    SINGLE_ENV,
    SPAWN_ENV,
    SPMD_ENV,
    where_saved,
)
from helpers.runif import RunIf

FIXED_BY = "0071-feature-xla-exact-resume-from-every-checkpoint.patch"

# Every trigger a user saves from with `ModelCheckpoint`, the defaults first: (its options and the run's, the global
# step of the kill, the checkpoint resumed, the step it holds, where the record says it was written). 12 batches an
# epoch, 2 epochs (3 for the epoch ends), validation twice an epoch unless the row says otherwise. Every run has a module
# and a callback that keep state in their own hooks (`stateful`).
TRIGGERS = {
    # ModelCheckpoint's default with validation once an epoch: `on_train_epoch_end`
    "epoch end (default, validation once an epoch)": (
        {"val_check_interval": 1.0, "epochs": 3}, 17, "last.ckpt", 12, "epoch end"),
    # ... and without validation
    # (1.8.6's ModelCheckpoint saves nothing at all without validation when `val_check_interval` is not 1.0)
    "epoch end (default, no validation)": (
        {"limit_val_batches": 0, "val_check_interval": 1.0, "epochs": 3}, 17, "last.ckpt", 12, "epoch end"),
    "every_n_epochs=1, save_on_train_epoch_end": (
        {"every_n_epochs": 1, "save_on_train_epoch_end": True, "epochs": 3}, 29, "epoch=1-step=24.ckpt", 24,
        "epoch end"),
    # the default with validation twice an epoch: at the end of each validation
    "validation end (default)": ({}, 16, "last.ckpt", 12, "between batches"),
    "validation end, mid-epoch": ({"every_n_train_steps": 5}, 8, "last.ckpt", 6, "between batches"),
    # `every_n_train_steps`, in the first epoch, between two validations
    "every_n_train_steps": ({"every_n_train_steps": 5}, 11, "last.ckpt", 10, "between batches"),
    "every_n_train_steps, second epoch": ({"every_n_train_steps": 5}, 17, "last.ckpt", 15, "between batches"),
    # at the end of the batch after which a validation is due: the resumed run trains on after it
    "every_n_train_steps, with a validation due": (
        {"every_n_train_steps": 3}, 7, "epoch=0-step=6.ckpt", 6, "between batches"),
    # the epoch's last batch: the resumed run ends the epoch
    "every_n_train_steps, the epoch's last batch": (
        {"every_n_train_steps": 6}, 13, "epoch=0-step=12.ckpt", 12, "between batches"),
}


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("trigger", list(TRIGGERS))
def test_a_sigkill_resumes_exactly_from_every_trigger(tmp_path, computed_once, fork_server, trigger):
    options, kill_at, checkpoint, saved_at, where = TRIGGERS[trigger]
    steps = 12 * options.get("epochs", 2)
    # written before each save returns: the kill finds the checkpoint of the position under test
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, kill_at, checkpoint, num_workers=0,
                            background_writes=False, stateful=True, **options)
    check_exact(runs, saved_at, steps=steps)
    assert where_saved(runs["saved"]) == (saved_at, where)


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


@RunIf(xla=True)
@pytest.mark.slow
def test_the_last_epochs_checkpoint_resumes_exactly_with_more_epochs(tmp_path, computed_once, fork_server):
    """A run of 2 epochs ends; its last checkpoint (the second epoch's end) resumed with ``max_epochs=3`` ends where an
    uninterrupted run of 3 epochs ends."""
    import torch

    config = {"augment": True, "num_workers": 0, "val_check_interval": 1.0, "stateful": True,
              "background_writes": False}
    reference = reference_run(computed_once, fork_server, SINGLE_ENV, {**config, "epochs": 3})
    run = {**config, "dirpath": str(tmp_path / "ckpts"), "logs": str(tmp_path / "logs")}
    run_config(fork_server, {**run, "epochs": 2, "out": str(tmp_path / "first")}, SINGLE_ENV, status=0)
    path = tmp_path / "ckpts" / "last.ckpt"
    saved = torch.load(path)
    out = run_config(fork_server, {**run, "epochs": 3, "out": str(tmp_path / "resumed"), "ckpt_path": str(path)},
               SINGLE_ENV, status=0)
    runs = {"reference": reference, "resumed": report_of(tmp_path / "resumed"), "output": out,
            "logged": logged_values(tmp_path / "logs"), "saved": saved}
    check_exact(runs, 24, steps=36)
    assert where_saved(saved) == (24, "epoch end")


@RunIf(xla=True)
@pytest.mark.slow
def test_a_sigkill_resumes_exactly_with_dataloader_workers(tmp_path, computed_once, fork_server):
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, 17, num_workers=2,
                            every_n_train_steps=5, stateful=True)
    # written in the background: step 15's checkpoint, or step 12's (a validation's end) if the kill came first
    check_exact(runs)
    assert where_saved(runs["saved"]) in ((15, "between batches"), (12, "between batches"))


@RunIf(xla=True)
@pytest.mark.slow
def test_a_sigkill_resumes_exactly_from_the_epoch_end_with_dataloader_workers(tmp_path, computed_once, fork_server):
    # the epoch end's write (in the background) lands before the kill three steps later, however loaded the host
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SINGLE_ENV, 15, num_workers=2,
                            save_on_train_epoch_end=True, stateful=True, kill_after_writes=True)
    check_exact(runs, 12)
    assert where_saved(runs["saved"]) == (12, "epoch end")


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
@pytest.mark.parametrize("sharded", [False, True], ids=["full", "sharded"])
def test_a_sigkill_under_spmd_resumes_exactly(tmp_path, computed_once, fork_server, strategy, sharded):
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SPMD_ENV, 11, num_workers=0, every_n_train_steps=5,
                            strategy=strategy, sharded=sharded, stateful=True)
    # written in the background: step 10's, or step 6's (a validation's end) if the kill came first
    check_exact(runs, tolerance=1e-6)
    assert where_saved(runs["saved"]) in ((10, "between batches"), (6, "between batches"))


@RunIf(xla=True)
@pytest.mark.slow
# the two ends of the SPMD space (a full checkpoint of replicated weights, a sharded one of FSDPv2 shards): the batch-end
# test above covers the four
@pytest.mark.parametrize("strategy, sharded", [("xla_spmd", False), ("xla_spmd_fsdp", True)],
                         ids=["full-xla_spmd", "sharded-xla_spmd_fsdp"])
def test_a_sigkill_under_spmd_resumes_exactly_from_the_epoch_end(tmp_path, computed_once, fork_server, strategy,
                                                                 sharded):
    """``save_on_train_epoch_end=True``, in the background: the same path as the default trigger with validation once
    an epoch, and the same uninterrupted run as the test above."""
    # the epoch end's write lands before the kill: a loaded host once killed it halfway (no committed version)
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SPMD_ENV, 15, num_workers=0,
                            save_on_train_epoch_end=True, strategy=strategy, sharded=sharded, stateful=True,
                            kill_after_writes=True)
    check_exact(runs, 12, tolerance=1e-6)
    assert where_saved(runs["saved"]) == (12, "epoch end")


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.parametrize("trigger", ["every 4", "epoch end"])
def test_a_sigkill_of_tpu_spawn_processes_resumes_exactly(tmp_path, computed_once, fork_server, trigger):
    """Two ``tpu_spawn`` processes, each seeded differently (each draws its own noise and dropout), 6 batches of the
    12 each an epoch: both are killed at step 5 (8), and the launcher fails; the resume from step 4's (the first
    epoch's end) ``last.ckpt`` gives each process its own states back."""
    if trigger == "every 4":
        options, kill_at, saved_at, where = {"every_n_train_steps": 4}, 5, 4, "between batches"
    else:
        options, kill_at, saved_at, where = {"val_check_interval": 1.0}, 8, 6, "epoch end"
    runs = kill_and_resume(computed_once, fork_server, tmp_path, SPAWN_ENV, kill_at, num_workers=0,
                            strategy="tpu_spawn", seed_by_rank=True, background_writes=False, status=1, **options)
    check_exact(runs, saved_at, tolerance=1e-6, steps=12)
    assert where_saved(runs["saved"]) == (saved_at, where)
    assert sorted(runs["saved"]["xla_preemption"]["ranks"]) == [0, 1]
    rank1 = json.loads((tmp_path / "resumed" / "report-rank1.json").read_text())
    reference1 = runs["reference"]["rank1"]
    assert [s["rows"] for s in rank1["steps"]] == [s["rows"] for s in reference1["steps"][saved_at:]]
    assert rank1["draws"] == reference1["draws"][saved_at:]


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
@pytest.mark.parametrize(
    "env, strategy",
    [
        (SINGLE_ENV, {}),
        (SPMD_ENV, {"strategy": "xla_spmd"}),
        (SPMD_ENV, {"strategy": "xla_spmd_fsdp", "sharded": True}),
    ],
    ids=["single", "xla_spmd", "xla_spmd_fsdp-sharded"],
)
def test_checkpoints_with_their_record_cost_the_steps_no_graph(computed_once, fork_server, env, strategy):
    """With a checkpoint every 5 steps (its record, its background write, written once the batch is over), a steady
    step still compiles nothing, executes one graph and reads one value (the logged loss); a step after a save adds
    the save's transfers (the state, the device's random seed) but no compilation and no execution."""
    reference = reference_run(computed_once, fork_server, env, {"augment": True, "epochs": 2, "num_workers": 0,
                                                             "every_n_train_steps": 5, **strategy})["report"]
    steps = reference["steps"]
    after_save, steady = [], []
    for before, now in zip(steps, steps[1:]):
        k = before["global_step"]
        counts = [now[c] - before[c] for c in ("compiles", "executions", "transfers")]
        if k % 6 == 0 or k < 3:  # a validation ran after step k, or still warming up
            continue
        (after_save if k % 5 == 0 else steady).append(counts)
    assert steady and all(c[0] == 0 and c[1] == 1 and c[2] <= 1 for c in steady), steady
    assert after_save and all(c[0] == 0 and c[1] == 1 for c in after_save), after_save


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
