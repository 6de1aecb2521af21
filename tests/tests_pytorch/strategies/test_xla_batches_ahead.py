"""How many batches are on the XLA device at once, for each ``batches_ahead`` (fix
`xla-single-device-batches-copied-on-loader-threads`): the batch of the step and ``batches_ahead`` batches the loader
thread copied ahead, ``batches_ahead + 1`` in all (``docs/overlap.md``), in training, validation and prediction. With
0 the batches are loaded and copied on the training thread, one at a time, as upstream does.

The count is exact: the dataloaders have no workers, so the thread that takes the batches loads them on the host,
when it takes one, up to ``batches_ahead`` beyond it (the loader thread only copies them: two threads drawing from the
process's random generators would draw in an order that depends on timing). In the step of batch ``k`` the test
waits until the loader thread has copied what it was given, then counts the live XLA tensors of the batches' shape,
and the batches loaded: ``k + batches_ahead + 1``, none beyond."""
import time
from typing import Any, Dict, List, Tuple

import pytest
import torch

import pytorch_lightning as pl
from helpers.runif import RunIf
from helpers.xla_batch_counts import batches_on_the_device, counted_loader
from helpers.xla_waits import _graph_report_off

FIXED_BY = "0061-xla-single-device-batches-copied-on-loader-threads.patch"

ROWS, FEATURES, STEP = 8, 13, 3  # a shape no other tensor of the run has; the batch measured


class _Loaded:
    """The collate function of one dataloader: counts the batches it made (on the thread that loads them)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, rows: List[Any]) -> Tuple[torch.Tensor, torch.Tensor]:
        self.count += 1
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def _loader(collate: _Loaded, batches: int = 12) -> torch.utils.data.DataLoader:
    return counted_loader(collate, batches, ROWS, FEATURES)


def _batches_on_the_device() -> int:
    return batches_on_the_device(ROWS, FEATURES)


class _Counting(pl.LightningModule):
    def __init__(self, ahead: int, loaders: Dict[str, _Loaded]) -> None:
        super().__init__()
        self.net = torch.nn.Linear(FEATURES, 3)
        self.ahead, self.loaders = ahead, loaders
        self.seen: Dict[str, Tuple[int, int]] = {}

    def _measure(self, stage: str, batch_idx: int) -> None:
        if batch_idx != STEP:
            return
        loaded = self.loaders[stage]
        # batches 0..STEP taken, the `ahead` after them loaded with the take and copied by the loader thread
        full = STEP + self.ahead + 1
        deadline = time.monotonic() + 30
        while _batches_on_the_device() < self.ahead + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.seen[stage] = (_batches_on_the_device(), loaded.count - full)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._measure("train", batch_idx)
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._measure("val", batch_idx)

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        self._measure("predict", batch_idx)
        return self.net(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@RunIf(xla=True)
@pytest.mark.parametrize("ahead", [0, 1, 2, 3])
def test_batches_ahead_bounds_the_batches_on_the_device(ahead, tmp_path):
    from pytorch_lightning import Trainer
    from pytorch_lightning.strategies import SingleTPUStrategy

    loaders = {stage: _Loaded() for stage in ("train", "val", "predict")}
    module = _Counting(ahead, loaders)
    trainer = Trainer(accelerator="tpu", devices=1, strategy=SingleTPUStrategy(device=0, batches_ahead=ahead),
                      max_steps=STEP + 2, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                      default_root_dir=tmp_path)
    with _graph_report_off():
        trainer.fit(module, _loader(loaders["train"]))
        trainer.validate(module, _loader(loaders["val"]))
        trainer.predict(module, _loader(loaders["predict"]))
    # (batches on the device, batches loaded beyond the bound)
    assert module.seen == {stage: (ahead + 1, 0) for stage in ("train", "val", "predict")}


@RunIf(xla=True)
def test_batches_ahead_is_a_count():
    from lightning_lite.strategies import XLAStrategy
    from pytorch_lightning.strategies import SingleTPUStrategy, TPUSpawnStrategy

    for make in (lambda n: SingleTPUStrategy(device=0, batches_ahead=n), lambda n: TPUSpawnStrategy(batches_ahead=n),
                 lambda n: XLAStrategy(batches_ahead=n)):
        assert make(0).batches_ahead == 0
        for wrong in (-1, 1.5, True):
            with pytest.raises(ValueError, match="`batches_ahead` must be an integer >= 0"):
                make(wrong)
