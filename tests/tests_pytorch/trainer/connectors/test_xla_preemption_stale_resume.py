"""No stale or silent resume from a preemption checkpoint.

- A ``fit`` that does not resume from the preemption checkpoint of its folder (a fresh run, ``ckpt_path=None``) moves
  it aside: otherwise, if that run crashed before its first ``last.ckpt``, the next ``ckpt_path="last"`` would resume
  the earlier run.
- The preemption checkpoint records the interrupted epoch's training dataloader (its length, its dataset's length,
  the batch size, ``drop_last``, the sampler's shuffling, a distributed sampler's replicas, rank and seed); a resume
  with another one is refused with a message that says what changed, instead of skipping the wrong batches.

Each run is a real ``fit`` on the XLA device of this process, stopped by a real ``SIGTERM`` that it sends itself.
"""
import os
import signal

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from helpers.runif import RunIf

FIXED_BY = "0057-feature-xla-preemption.patch"

SIGNAL_AT_STEP = 2


@pytest.fixture
def sigterm_default():
    """This process's ``SIGTERM`` at its default action, as in a training process, before the test and after it."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


def _callback(signal_at=None, crash_at=None):
    from pytorch_lightning import Callback

    class Events(Callback):
        """Sends this process ``SIGTERM`` or raises at a global step; records the step each fit started at."""

        def __init__(self):
            self.started_at = None

        def on_train_start(self, trainer, pl_module):
            self.started_at = trainer.global_step

        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
            if trainer.global_step == crash_at:
                raise RuntimeError("the run crashed")

    return Events()


def _model(**loader):
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Model(BoringModel):
        def train_dataloader(self):
            options = {"batch_size": 2, "shuffle": True, **loader}
            dataset = RandomDataset(32, options.pop("rows", 64))
            if "num_replicas" in options:
                options["sampler"] = DistributedSampler(
                    dataset, num_replicas=options.pop("num_replicas"), rank=0, shuffle=options.pop("shuffle")
                )
            return DataLoader(dataset, **options)

    return Model()


def _fit(dirpath, root, callback, ckpt_path=None, **loader):
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint

    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                      callbacks=[ModelCheckpoint(dirpath=dirpath, save_last=True), callback])
    trainer.fit(_model(**loader), ckpt_path=ckpt_path)
    return trainer


def _preempt(dirpath, root, **loader):
    from pytorch_lightning.trainer.connectors.xla_preemption import XLAPreempted

    with pytest.raises(XLAPreempted) as preempted:
        _fit(dirpath, root, _callback(signal_at=SIGNAL_AT_STEP), **loader)
    assert preempted.value.path == f"{dirpath}/last-preempted.ckpt"
    return preempted.value.path


def _fs(dirpath):
    from fsspec.core import url_to_fs

    fs, folder = url_to_fs(dirpath)
    fs.invalidate_cache()
    return fs, folder


def _names(dirpath):
    fs, folder = _fs(dirpath)
    return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(folder, detail=False))


@RunIf(xla=True)
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_fresh_run_moves_an_older_preemption_checkpoint_aside(tmp_path, sigterm_default, request, where):
    dirpath = str(tmp_path / "ckpts") if where == "local" else f"{request.getfixturevalue('gcs_bucket')}/run"
    path = _preempt(dirpath, tmp_path)
    assert _names(dirpath) == ["last-preempted.ckpt"]

    # a fresh run in the same folder, which crashes before it writes its first `last.ckpt`
    with pytest.warns(UserWarning, match="found the preemption checkpoint of an earlier run") as warned:
        with pytest.raises(RuntimeError, match="the run crashed"):
            _fit(dirpath, tmp_path, _callback(crash_at=1))
    (moved,) = [n for n in _names(dirpath) if n.startswith("preempted-")]
    assert _names(dirpath) == [moved]
    (message,) = [str(w.message) for w in warned if "preemption checkpoint" in str(w.message)]
    assert message == (
        f"a fresh `fit` found the preemption checkpoint of an earlier run at {path}: moved it to {dirpath}/{moved}, so"
        ' that `ckpt_path="last"` cannot resume that run by mistake. To continue the earlier run instead, stop this'
        f" one and call `fit(..., ckpt_path={dirpath + '/' + moved!r})`."
    )

    # the next start with `ckpt_path="last"` does not resume the earlier run: it starts afresh
    restarted = _callback()
    _fit(dirpath, tmp_path, restarted, ckpt_path="last")
    assert restarted.started_at == 0

    # the moved checkpoint still resumes the earlier run, at its step, when asked to
    earlier = _callback()
    _fit(dirpath, tmp_path, earlier, ckpt_path=f"{dirpath}/{moved}")
    assert earlier.started_at == SIGNAL_AT_STEP


@RunIf(xla=True)
# a guard: resuming from the preemption checkpoint itself leaves it where it is until the run has finished
@pytest.mark.guard
def test_the_resume_from_the_preemption_checkpoint_keeps_it(tmp_path, sigterm_default):
    dirpath = str(tmp_path / "ckpts")
    _preempt(dirpath, tmp_path)
    resumed = _callback(crash_at=SIGNAL_AT_STEP + 1)
    with pytest.raises(RuntimeError, match="the run crashed"):
        _fit(dirpath, tmp_path, resumed, ckpt_path="last")
    assert resumed.started_at == SIGNAL_AT_STEP
    assert _names(dirpath) == ["last-preempted.ckpt"]


@RunIf(xla=True)
@pytest.mark.parametrize(
    "saved, resumed, changed",
    [
        pytest.param({}, {"batch_size": 4},
                     "the number of batches of the epoch 32 -> 16, length 32 -> 16, batch_size 2 -> 4", id="batch_size"),
        pytest.param({}, {"shuffle": False}, "shuffle True -> False", id="shuffle"),
        # as many batches as before: only the dataset's length tells
        pytest.param({"drop_last": True}, {"drop_last": True, "rows": 65}, "dataset length 64 -> 65", id="dataset"),
        pytest.param({"drop_last": True, "rows": 65}, {"rows": 65},
                     "the number of batches of the epoch 32 -> 33, length 32 -> 33, drop_last True -> False",
                     id="drop_last"),
        pytest.param({"num_replicas": 2}, {"num_replicas": 4},
                     "the number of batches of the epoch 16 -> 8, length 16 -> 8, distributed sampler's num_replicas"
                     " 2 -> 4", id="num_replicas"),
    ],
)
def test_a_resume_with_another_dataloader_is_refused(tmp_path, sigterm_default, saved, resumed, changed):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    dirpath = str(tmp_path / "ckpts")
    path = _preempt(dirpath, tmp_path, **saved)
    with pytest.raises(MisconfigurationException) as refused:
        _fit(dirpath, tmp_path, _callback(), ckpt_path="last", **resumed)
    assert str(refused.value) == (
        f"The preemption checkpoint {path} was written in an epoch of another training dataloader: {changed}."
        " Resuming would skip the wrong batches. To resume, train with the dataloader it was written with; to start"
        " again instead, call `fit(..., ckpt_path=None)`, which moves that checkpoint aside."
    )
    # the same dataloader resumes
    same = _callback()
    _fit(dirpath, tmp_path, same, ckpt_path="last", **saved)
    assert same.started_at == SIGNAL_AT_STEP
