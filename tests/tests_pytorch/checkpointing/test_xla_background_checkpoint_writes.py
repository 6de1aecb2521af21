"""On XLA, ``ModelCheckpoint``'s saves cost the training thread only the copy of the state to the host: the file is
serialised and written on a writer thread while training goes on (``XLACheckpointIO(background_writes=...)``).

One save is in flight at a time; a user's ``trainer.save_checkpoint``, the end of ``fit`` and a preemption wait for it;
a removal of an older top-k file runs only after the writes before it; a write that fails stops the run at the next
step with the path and the cause, and removes nothing; a process killed during a write leaves the previous checkpoint
whole. The tests run on a real XLA device (XLA:CPU) with real files, and a real ``SIGKILL`` for the last point.
"""
import errno
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import torch
from torch.utils.data import DataLoader

from helpers.runif import RunIf

FIXED_BY = "0073-feature-xla-checkpoint-writes-in-the-background.patch"

WRITER = "pl-xla-checkpoint-writer"


class _Writes:
    """Records the thread of every checkpoint write, and fails the writes of the paths it is told to."""

    def __init__(self, monkeypatch: Any, fail: Optional[str] = None) -> None:
        from lightning_lite.plugins.io import xla

        self.threads: List[str] = []
        self.paths: List[str] = []
        real = xla._atomic_write

        def write(data: bytes, path: Any) -> None:
            self.threads.append(threading.current_thread().name)
            self.paths.append(os.path.basename(str(path)))
            if fail is not None and os.path.basename(str(path)) == fail:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(data, path)

        monkeypatch.setattr(xla, "_atomic_write", write)


def _fit(tmp_path: Path, callbacks: List[Any], strategy: Any = None, max_epochs: int = 1, **checkpoint: Any) -> Any:
    from pytorch_lightning import seed_everything, Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    seed_everything(7)

    class Model(BoringModel):
        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 32), batch_size=2, shuffle=True)

    options = {"dirpath": tmp_path / "ckpts", "every_n_train_steps": 4, "save_top_k": -1, **checkpoint}
    model_checkpoint = ModelCheckpoint(**options)
    kwargs = {"strategy": strategy} if strategy is not None else {"devices": 1}
    trainer = Trainer(accelerator="tpu", max_epochs=max_epochs, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[model_checkpoint, *callbacks], **kwargs)
    trainer.fit(Model())
    return trainer


def _weights(path: Path) -> Dict[str, torch.Tensor]:
    return torch.load(path)["state_dict"]


@RunIf(xla=True)
def test_model_checkpoint_writes_on_the_writer_thread_and_the_files_are_the_same(tmp_path, monkeypatch):
    from pytorch_lightning.strategies import SingleTPUStrategy
    from lightning_lite.plugins.io.xla import XLACheckpointIO

    writes = _Writes(monkeypatch)
    _fit(tmp_path / "background", [])
    assert writes.threads and set(writes.threads) == {f"{WRITER}_0"}
    assert writes.paths == [f"epoch=0-step={s}.ckpt" for s in (4, 8, 12, 16)]
    writes.threads.clear()
    _fit(tmp_path / "sync", [], strategy=SingleTPUStrategy(device=0, checkpoint_io=XLACheckpointIO(background_writes=False)))
    assert set(writes.threads) == {"MainThread"}
    for step in (4, 8, 12, 16):
        name = f"epoch=0-step={step}.ckpt"
        background, sync = _weights(tmp_path / "background" / "ckpts" / name), _weights(tmp_path / "sync" / "ckpts" / name)
        assert background.keys() == sync.keys()
        assert all(torch.equal(background[k], sync[k]) for k in sync)


@RunIf(xla=True)
def test_the_variable_turns_background_writes_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PL_XLA_BACKGROUND_CHECKPOINT_WRITES", "0")
    writes = _Writes(monkeypatch)
    _fit(tmp_path, [])
    assert writes.paths and set(writes.threads) == {"MainThread"}


@RunIf(xla=True)
def test_a_users_save_checkpoint_is_written_when_it_returns(tmp_path, monkeypatch):
    from pytorch_lightning import Callback

    writes = _Writes(monkeypatch)
    seen = []

    class SaveOwn(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 6:
                path = tmp_path / "own.ckpt"
                trainer.save_checkpoint(path)
                # written, on this thread, after the background write of step 4 ended
                seen.append((path.exists(), threading.current_thread().name))
                seen.append(torch.load(path)["global_step"])

    _fit(tmp_path, [SaveOwn()])
    assert seen == [(True, "MainThread"), 6]
    assert writes.paths.index("own.ckpt") > writes.paths.index("epoch=0-step=4.ckpt")


@RunIf(xla=True)
def test_a_failed_write_stops_the_run_at_the_next_step_and_removes_nothing(tmp_path, monkeypatch):
    from pytorch_lightning import Callback

    _Writes(monkeypatch, fail="epoch=0-step=8.ckpt")
    steps = []

    class Steps(Callback):
        def on_train_batch_start(self, trainer, *args):
            steps.append(trainer.global_step)

    with pytest.raises(RuntimeError) as failed:
        # top-1 by step: saving step 8 would remove step 4's file once step 8's is written
        _fit(tmp_path, [Steps()], monitor="step", mode="max", save_top_k=1)
    message = str(failed.value)
    assert "epoch=0-step=8.ckpt" in message and "No space left on device" in message
    assert isinstance(failed.value.__cause__, OSError)
    # the run stopped at the first step that began after the write failed, at the latest at the next save (the end of
    # the batch that begins at step 11 waits for the write in flight)
    assert 7 <= steps[-1] <= 11
    # the older checkpoint was not removed for a newer one that does not exist
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["epoch=0-step=4.ckpt"]
    assert torch.load(tmp_path / "ckpts" / "epoch=0-step=4.ckpt")["global_step"] == 4


@RunIf(xla=True)
def test_top_k_removals_wait_for_the_writes_before_them(tmp_path, monkeypatch):
    from lightning_lite.plugins.io import xla

    events: List[str] = []
    real_write, real_remove = xla._atomic_write, xla.TorchCheckpointIO.remove_checkpoint

    def write(data, path):
        name = os.path.basename(str(path))
        if name == "epoch=0-step=8.ckpt":
            # still writing when `ModelCheckpoint` removes step 4's file right after submitting this write
            time.sleep(1.0)
        real_write(data, path)
        events.append(f"wrote {name} on {threading.current_thread().name}")

    def remove(self, path):
        events.append(f"remove {os.path.basename(str(path))} on {threading.current_thread().name}")
        real_remove(self, path)

    monkeypatch.setattr(xla, "_atomic_write", write)
    monkeypatch.setattr(xla.TorchCheckpointIO, "remove_checkpoint", remove)
    _fit(tmp_path, [], monitor="step", mode="max", save_top_k=1)
    # the removal of step 4's file was queued behind step 8's write, which was still running: it ran after it, on the
    # writer thread; later removals may run on the training thread once the write before them has ended
    assert events[:3] == [f"wrote epoch=0-step=4.ckpt on {WRITER}_0", f"wrote epoch=0-step=8.ckpt on {WRITER}_0",
                          f"remove epoch=0-step=4.ckpt on {WRITER}_0"]
    assert sorted(os.listdir(tmp_path / "ckpts")) == ["epoch=0-step=16.ckpt"]


def _run(fork_server: Any, config: Dict[str, Any], status: int) -> str:
    code = "import json, sys\nfrom helpers.preemption_runs import main\nmain(json.loads(sys.argv[1]))"
    proc: subprocess.CompletedProcess = fork_server({"PJRT_DEVICE": "CPU"}).run(code, [json.dumps(config)],
                                                                                timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, f"exit status {proc.returncode}, not {status}\n{out[-6000:]}"
    return out


@RunIf(xla=True)
@pytest.mark.slow
def test_a_sigkill_during_a_background_write_leaves_the_previous_checkpoint_to_resume_from(tmp_path, fork_server):
    """The write of step 10's checkpoints is held in its `fsync` (its bytes are in the temporary file) when the
    process is killed at step 11: ``last.ckpt`` is still the one of step 6 (a validation's end), whole, and the run
    resumes from it exactly."""
    from helpers.preemption_runs import weights_diff  # noqa: F401 (the module the runs import)

    config = {"augment": True, "epochs": 2, "num_workers": 0, "every_n_train_steps": 5,
              "dirpath": str(tmp_path / "ckpts"), "logs": str(tmp_path / "logs")}
    _run(fork_server, {**config, "out": str(tmp_path / "reference"), "dirpath": str(tmp_path / "reference-ckpts")}, 0)
    _run(fork_server, {**config, "out": str(tmp_path / "killed"), "kill_at_step": 11,
                       "slow_fsync_of": "epoch=0-step=10.ckpt"}, -signal.SIGKILL)
    names = sorted(os.listdir(tmp_path / "ckpts"))
    assert "epoch=0-step=10.ckpt" not in names and "last.ckpt" in names
    # the write that was cut short left its temporary file, never a partial checkpoint
    assert any(name.startswith(".epoch=0-step=10.ckpt.") and name.endswith(".tmp") for name in names)
    last = torch.load(tmp_path / "ckpts" / "last.ckpt")
    assert last["global_step"] == 6
    _run(fork_server, {**config, "out": str(tmp_path / "resumed"), "ckpt_path": str(tmp_path / "ckpts" / "last.ckpt")},
         0)
    reference = json.loads((tmp_path / "reference" / "report-rank0.json").read_text())
    resumed = json.loads((tmp_path / "resumed" / "report-rank0.json").read_text())
    assert resumed["global_step"] == reference["global_step"] == 24
    assert [s["rows"] for s in resumed["steps"]] == [s["rows"] for s in reference["steps"][6:]]
    assert resumed["weights"] == reference["weights"]


@RunIf(xla=True)
def test_a_trainer_with_its_checkpoint_io_pickles_and_writes_again(tmp_path):
    """``torch.save(trainer)`` (upstream's ``test_model_torch_save``) pickles the strategy's checkpoint IO: its writer
    thread and queue stay behind, and the unpickled one writes in the background again."""
    import pickle

    from lightning_lite.plugins.io.xla import XLACheckpointIO

    io = XLACheckpointIO()
    io._writer.submit(lambda: None, "nothing")
    io.wait_for_writes()
    copy = pickle.loads(pickle.dumps(io))
    assert copy.background_writes and copy._writer is not io._writer
    done = []
    copy._writer.submit(lambda: done.append(threading.current_thread().name), "a task")
    copy.wait_for_writes()
    assert done == [f"{WRITER}_0"]


@RunIf(xla=True)
def test_a_logger_that_reads_the_saved_file_gets_it_written_first(tmp_path, monkeypatch):
    """Weights & Biases and Neptune upload a checkpoint in ``after_save_checkpoint``, right after the save: with such a
    logger the file is written before the save returns. Outside ``fit`` too (``ModelCheckpoint`` called directly)."""
    from pytorch_lightning.loggers import CSVLogger

    class Uploading(CSVLogger):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.found = []

        def after_save_checkpoint(self, checkpoint_callback):
            self.found.append(os.path.exists(checkpoint_callback.last_model_path or checkpoint_callback.best_model_path))

    writes = _Writes(monkeypatch)
    logger = Uploading(tmp_path / "logs")
    from pytorch_lightning import seed_everything, Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.demos.boring_classes import BoringModel

    seed_everything(7)
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=8, limit_val_batches=0, logger=logger,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=4, save_top_k=-1)])
    trainer.fit(BoringModel())
    assert logger.found == [True, True]
    assert set(writes.threads) == {"MainThread"}



@RunIf(xla=True)
def test_a_steps_top_k_file_and_last_ckpt_share_one_host_copy(tmp_path, monkeypatch):
    """``ModelCheckpoint(save_last=True)`` saves a step's state twice; the second save takes the first one's host copies
    instead of waiting for its write or copying again, and the copies are let go once the run goes on."""
    import torch_xla.core.xla_model as xm

    from lightning_lite.plugins.io import xla

    copied: List[int] = []
    real_copy, real_write = xm._maybe_convert_to_cpu, xla._atomic_write

    def copy(data, convert=True):
        copied.append(len(data))
        return real_copy(data, convert=convert)

    def write(data, path):
        if os.path.basename(str(path)).startswith("epoch="):
            time.sleep(0.5)  # the top-k file is still being written when `last.ckpt` is saved
        real_write(data, path)

    monkeypatch.setattr(xm, "_maybe_convert_to_cpu", copy)
    monkeypatch.setattr(xla, "_atomic_write", write)
    trainer = _fit(tmp_path, [], save_last=True)
    # steps 4, 8, 12, 16: the top-k save copies the weights and the optimizer state, `last.ckpt`'s copies nothing
    assert len(copied) == 8 and all(n > 0 for n in copied[::2]) and copied[1::2] == [0, 0, 0, 0]
    assert trainer.strategy.checkpoint_io._copies == {}
    assert sorted(os.listdir(tmp_path / "ckpts")) == [f"epoch=0-step={s}.ckpt" for s in (12, 16, 4, 8)] + ["last.ckpt"]
