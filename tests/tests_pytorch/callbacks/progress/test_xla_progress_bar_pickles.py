"""A progress bar (and so the Trainer it refers to) pickles after a run on one XLA device.

On one XLA device the dataloaders are put behind a loader that copies their batches on a thread of its own. Its
state of a pass (the thread, its queue and its stop event) does not pickle, and the bar reaches it through its
Trainer: ``pickle.dumps(bar)`` failed with ``cannot pickle '_thread.lock' object``. The loader now pickles without
that state, as a loader that has not started a pass, and iterates again once unpickled.
"""
import pickle

import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0061-xla-single-device-batches-copied-on-loader-threads.patch"


@pytest.mark.guard  # true before the batches were copied on a loader thread
@RunIf(xla=True)
def test_the_bar_pickles_after_every_stage(tmp_path):
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.demos.boring_classes import BoringModel

    bar = TQDMProgressBar()
    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, callbacks=[bar], max_epochs=1,
                      limit_train_batches=2, limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2,
                      logger=False, enable_model_summary=False, enable_checkpointing=False)
    model = BoringModel()
    pickle.dumps(bar)
    trainer.fit(model)
    pickle.dumps(bar)
    trainer.validate(model)
    pickle.dumps(bar)
    trainer.test(model)
    pickle.dumps(bar)
    trainer.predict(model)
    pickle.dumps(bar)


@pytest.mark.guard  # true before the batches were copied on a loader thread (the dataloader pickled)
@RunIf(xla=True)
def test_the_device_loader_pickles_in_a_pass_and_iterates_once_unpickled(tmp_path):
    from torch.utils.data import DataLoader

    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False,
                      enable_model_summary=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.strategy.connect(BoringModel())
    data = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    loader = trainer.strategy.process_dataloader(DataLoader(data, batch_size=2))
    batches = iter(loader)
    first = next(batches)  # a pass is running, with its thread
    copy = pickle.loads(pickle.dumps(loader))
    assert torch.equal(first.cpu(), data[:2])
    again = list(copy)
    assert [batch.device.type for batch in again] == ["xla"] * 3
    assert torch.equal(torch.cat([batch.cpu() for batch in again]), data)
    assert len(copy) == 3 and copy.batch_size == 2
    # the first pass goes on, and ends its thread
    assert len(list(batches)) == 2
