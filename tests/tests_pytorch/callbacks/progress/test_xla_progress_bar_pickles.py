"""A progress bar (and so the Trainer it refers to) pickles after a run on one XLA device.

On one XLA device the batches are copied on a thread of their own. When the Trainer held the loader of that thread
in place of the user's dataloader, the bar reached the thread's state (its queue and stop event) through its Trainer:
``pickle.dumps(bar)`` failed with ``cannot pickle '_thread.lock' object``. The thread now lives in the data fetcher's
pass only, and the Trainer keeps the user's dataloaders.
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
