"""On one XLA device the batches reach the device on a loader thread, ahead of their step (fix
`xla-single-device-batches-copied-on-loader-threads`): with the values' copy made off the training thread
(`xla-host-copies-off-the-training-thread`), the training thread of a steady step neither reads from the device nor
copies to it, in every way users train below, and in validation, test and predict. Before the fix each batch was
copied on the training thread (``batch_to_device``), behind the step in flight.

The loader thread and the copying thread end with the run, however it ends: the guards below."""
import os
import signal
import threading
import time
from typing import Any, Callable, List

import pytest
import torch

import pytorch_lightning as pl
from helpers.runif import RunIf
from helpers.xla_waits import _graph_report_off, check_a_steady_step_never_waits, evaluation_run, pattern_module
from helpers.xla_waits import BATCH, pattern_loader
from helpers.xla_waits import pattern_run, PATTERNS, waits_of
from helpers.xla_subprocess import run_code

FIXED_BY = "0061-xla-single-device-batches-copied-on-loader-threads.patch"


@RunIf(xla=True)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_steady_training_step_never_waits_for_the_device(pattern, tmp_path):
    check_a_steady_step_never_waits(pattern_run(pattern, tmp_path))


@RunIf(xla=True)
def test_validation_test_and_predict_steps_never_wait_for_the_device(tmp_path):
    for stage, rows in evaluation_run(tmp_path).items():
        assert len(rows) >= 4, stage
        assert [waits_of(row) for row in rows] == [0] * len(rows), (stage, [row["what"] for row in rows])


@pytest.mark.guard  # true before the fix too: every batch came on the host then
@RunIf(xla=True)
@pytest.mark.parametrize("hook", ["on_before_batch_transfer", "transfer_batch_to_device"])
def test_a_module_that_transforms_host_batches_still_gets_them_on_the_host(hook, tmp_path):
    """A module that overrides a hook of the batch's way to the device sees its batches on the host, as before."""
    from pytorch_lightning import Trainer

    seen = []
    module = pattern_module("automatic")

    if hook == "on_before_batch_transfer":
        def on_before_batch_transfer(batch, dataloader_idx):
            seen.append(batch[0].device.type)
            return batch
        module.on_before_batch_transfer = on_before_batch_transfer
    else:
        def transfer_batch_to_device(batch, device, dataloader_idx):
            seen.append(batch[0].device.type)
            return [t.to(device) for t in batch]
        module.transfer_batch_to_device = transfer_batch_to_device
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=3, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
    trainer.fit(module, pattern_loader(3))
    assert seen == ["cpu"] * 3
    assert all(torch.isfinite(p).all() for p in module.parameters())


def _threads_left_by(run: Callable[[], Any]) -> List[str]:
    """The threads that ``run`` started and left running (tqdm's monitor apart: it is not Lightning's), and
    Lightning's XLA threads that run at its end, even when an earlier test started them."""
    before = set(threading.enumerate())
    run()
    return [
        thread.name for thread in threading.enumerate()
        if thread.is_alive() and type(thread).__name__ != "TMonitor"
        and (thread not in before or thread.name.startswith("pl-xla-"))
    ]


class _EndsInStep(pl.Callback):
    """Ends the run in the training step ``at``: with an error, or with a real ``SIGINT`` (Ctrl-C)."""

    def __init__(self, how: str, at: int = 5) -> None:
        self.how, self.at = how, at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx != self.at:
            return
        if self.how == "error":
            raise RuntimeError("the step failed")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the KeyboardInterrupt comes first


@pytest.mark.guard  # no loader thread before the fix either; the earlier form of the fix left its threads running
@RunIf(xla=True)
@pytest.mark.parametrize("how", ["max_steps", "epochs", "error", "ctrl-c", "validate", "test", "predict"])
def test_no_thread_works_with_the_device_once_the_run_is_over(how, tmp_path):
    """The loader thread (and the copying thread of the values) end with the run, however it ends: a thread that is
    inside torch_xla when the interpreter exits aborts the process (``terminate called without an active exception``),
    and one that is left running keeps its batches on the device."""
    from pytorch_lightning import Trainer

    module = pattern_module("automatic")
    module.validation_step = module.test_step = lambda batch, batch_idx: module.log("eval_loss", module.loss(batch))
    module.predict_step = lambda batch, batch_idx, dataloader_idx=0: module.net(batch[0])
    callbacks = [_EndsInStep(how)] if how in ("error", "ctrl-c") else []
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=2, max_steps=4 if how == "max_steps" else -1,
                      limit_val_batches=2, default_root_dir=tmp_path, logger=False, enable_checkpointing=False,
                      enable_model_summary=False, enable_progress_bar=False, callbacks=callbacks)
    stage = how if how in ("validate", "test", "predict") else "fit"

    def run() -> None:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # whoever started pytest
        try:
            if stage == "fit":  # with a validation run that stops early in each epoch (`limit_val_batches`)
                trainer.fit(module, pattern_loader(12), pattern_loader(12))
            else:
                getattr(trainer, stage)(module, pattern_loader(12))
        except RuntimeError as err:
            assert how == "error" and "the step failed" in str(err)
        finally:
            signal.signal(signal.SIGINT, previous)

    with _graph_report_off():
        left = _threads_left_by(run)
    assert left == []
    assert trainer.interrupted == (how in ("error", "ctrl-c"))
    if stage == "fit":
        assert trainer.global_step == {"max_steps": 4, "epochs": 24, "error": 5, "ctrl-c": 5}[how]


_EXITS_WITH_A_PASS_IN_FLIGHT = """
import atexit, threading, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

def left():
    # registered first, so it runs last: after Lightning's own exit handler
    print("left:", sorted(t.name for t in threading.enumerate() if t.name.startswith("pl-xla")), flush=True)

atexit.register(left)
from pytorch_lightning.utilities.xla_device_loader import _ToDevice
from lightning_lite.utilities.xla_batches import _BatchesAhead
import torch_xla

# 8 MB batches: when the script exits, the thread is copying the next one (torch_xla's own `MpDeviceLoader` aborts
# the process here, every time)
batches = _BatchesAhead(DataLoader(TensorDataset(torch.randn(8 * 1024, 2048)), batch_size=1024),
                        _ToDevice(torch_xla.device()))
passing = iter(batches)
next(passing), next(passing)
print("running:", sorted(t.name for t in threading.enumerate() if t.name.startswith("pl-xla")), flush=True)
sys.exit(0)
"""


@pytest.mark.guard
@RunIf(xla=True)
def test_the_loader_thread_ends_before_the_interpreter_exits(tmp_path, fork_server):
    """A process that exits in the middle of a pass (a script's own loop, Lite) ends the loader thread before the
    interpreter does, in a real child process: a thread inside torch_xla at that point would abort the process
    (``terminate called without an active exception``) instead of letting it exit with its own status."""
    proc = run_code(_EXITS_WITH_A_PASS_IN_FLIGHT, env={"PJRT_DEVICE": "CPU"}, timeout=240, fork_server=fork_server)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "running: ['pl-xla-batches']" in proc.stdout
    assert "left: []" in proc.stdout, proc.stdout
    assert "terminate called" not in proc.stderr


@pytest.mark.guard  # true before the fix too: the loader's error came on the training thread then
@RunIf(xla=True)
def test_an_error_of_the_dataloader_is_raised_by_fit(tmp_path):
    """A dataset that fails on its 6th batch fails ``fit`` with its own error, raised on the training thread where
    that batch would have come, after the 5 batches before it trained; no thread is left behind."""
    from torch.utils.data import DataLoader, Dataset

    from pytorch_lightning import Trainer

    class Fails(Dataset):
        def __len__(self) -> int:
            return 12 * 8

        def __getitem__(self, i: int):
            if i == 5 * 8:
                raise ValueError("sample 40 is corrupt")
            return torch.randn(16), torch.tensor(i % 4)

    module = pattern_module("automatic")
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)

    def run() -> None:
        with pytest.raises(ValueError, match="sample 40 is corrupt"):
            trainer.fit(module, DataLoader(Fails(), batch_size=8))

    with _graph_report_off():
        assert _threads_left_by(run) == []
    assert trainer.global_step == 5


class _UsersLoader(torch.utils.data.DataLoader):
    """A dataloader class of the user's own: the Trainer's attributes and warnings name it."""


def _users_loader(batches: int, **kwargs: Any) -> _UsersLoader:
    loader = pattern_loader(batches)
    return _UsersLoader(loader.dataset, batch_size=loader.batch_size, **kwargs)


# fails without the fix (no loader thread) and with its earlier form (its loader in the Trainer's attributes)
@RunIf(xla=True)
def test_the_trainer_keeps_the_user_s_dataloaders(tmp_path):
    """The loader thread lives in the pass over the batches only: the Trainer's dataloaders are the user's own, in
    ``fit`` (during the run too), ``validate``, ``test`` and ``predict``, while the batches still come on the device,
    copied on the loader thread."""
    from pytorch_lightning import Callback, Trainer

    module = pattern_module("automatic")
    module.validation_step = module.test_step = lambda batch, batch_idx: module.log("eval_loss", module.loss(batch))
    module.predict_step = lambda batch, batch_idx, dataloader_idx=0: module.net(batch[0])
    train, val = _users_loader(6), _users_loader(3)
    seen = []

    class Probe(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            loader_thread = any(t.name == "pl-xla-batches" and t.is_alive() for t in threading.enumerate())
            seen.append((trainer.train_dataloader.loaders is train, batch[0].device.type, loader_thread))

    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                      callbacks=[Probe()])
    with _graph_report_off():
        trainer.fit(module, train, val)
        assert seen[:3] == [(True, "xla", True)] * 3  # the thread still loads the batches after the third
        assert len(seen) == 6 and all(s[:2] == (True, "xla") for s in seen)
        assert trainer.train_dataloader.loaders is train
        assert trainer.val_dataloaders == [val]
        for stage in ("validate", "test"):
            loader = _users_loader(3)
            getattr(trainer, stage)(module, loader)
            assert getattr(trainer, f"{stage[:4] if stage == 'test' else 'val'}_dataloaders") == [loader], stage
        predictions = trainer.predict(module, _users_loader(3))
    assert len(predictions) == 3 and all(p.shape == (8, 4) for p in predictions)
    # predict gives the loader a sampler that tracks the batch indices (upstream), in a new loader of the user's class
    assert [type(loader) for loader in trainer.predict_dataloaders] == [_UsersLoader]


@pytest.mark.guard  # upstream's behaviour; an earlier form of the fix hid the user's dataloader from these warnings
@RunIf(xla=True)
def test_the_dataloader_warnings_name_the_user_s_dataloader(tmp_path):
    from unittest import mock

    from pytorch_lightning import Trainer

    module = pattern_module("automatic")
    module.validation_step = lambda batch, batch_idx: module.log("eval_loss", module.loss(batch))
    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
    with _graph_report_off():
        with mock.patch("multiprocessing.cpu_count", return_value=8), pytest.warns(
            UserWarning, match="The dataloader, val_dataloader 0, does not have many workers"
        ):
            trainer.validate(module, _users_loader(2))
        with pytest.warns(UserWarning, match="Total length of `_UsersLoader` across ranks is zero"):
            trainer.validate(module, _users_loader(0))


@pytest.mark.guard  # upstream's behaviour; an earlier form of the fix left persistent workers running
@RunIf(xla=True)
@pytest.mark.parametrize("persistent_workers", [False, True])
def test_the_dataloader_workers_are_shut_down_when_the_run_fails(persistent_workers, tmp_path):
    """A run that fails in its second epoch shuts down the workers of its dataloaders and forgets their iterators,
    as upstream does: the loader thread lets go of the iterator before the Trainer shuts the workers down."""
    from pytorch_lightning import Callback, Trainer

    workers = []

    class Recording(_UsersLoader):
        def _get_iterator(self):
            iterator = super()._get_iterator()
            workers.extend(iterator._workers)  # the processes, not the iterator: its end is the Trainer's to decide
            return iterator

    class Fails(Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            if trainer.current_epoch == 1:
                raise RuntimeError("the epoch failed")

    def loader() -> Recording:
        data = pattern_loader(12).dataset
        return Recording(data, batch_size=BATCH, num_workers=1, persistent_workers=persistent_workers)

    train, val = loader(), loader()
    module = pattern_module("automatic")
    module.validation_step = lambda batch, batch_idx: module.log("eval_loss", module.loss(batch))
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=3, limit_train_batches=2, limit_val_batches=2,
                      default_root_dir=tmp_path, logger=False, enable_checkpointing=False, enable_model_summary=False,
                      enable_progress_bar=False, callbacks=[Fails()])
    with _graph_report_off(), pytest.raises(RuntimeError, match="the epoch failed"):
        trainer.fit(module, train, val)
    # persistent workers: one for each loader; else one a pass (sanity check, two epochs of each)
    assert len(workers) == (2 if persistent_workers else 5)
    assert [w.is_alive() for w in workers] == [False] * len(workers)
    assert train._iterator is None and val._iterator is None


@pytest.mark.guard  # upstream's behaviour (`move_data_to_device`); torch_xla's copy turned tuples into lists
@RunIf(xla=True)
def test_the_batches_keep_their_collection_types(tmp_path):
    """A batch copied on the loader thread keeps its type: a namedtuple stays that namedtuple, a tuple a tuple, a
    dict subclass that class, all on the device."""
    from collections import namedtuple, OrderedDict

    from pytorch_lightning import Trainer

    Pair = namedtuple("Pair", ["x", "y"])
    module = pattern_module("automatic")
    seen = []

    def training_step(batch, batch_idx):
        pair, (x, y), named = batch
        seen.append((type(batch), type(pair), type(batch[1]), type(named), {t.device.type for t in (*pair, x, y)}))
        return module.loss(pair) + 0 * module.loss((named["x"], y))

    def collate(samples):
        x, y = torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])
        return Pair(x, y), (x, y), OrderedDict(x=x)

    module.training_step = training_step
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=3, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
    with _graph_report_off():
        trainer.fit(module, torch.utils.data.DataLoader(pattern_loader(3).dataset, batch_size=BATCH,
                                                        collate_fn=collate))
    assert seen == [(tuple, Pair, tuple, OrderedDict, {"xla"})] * 3
