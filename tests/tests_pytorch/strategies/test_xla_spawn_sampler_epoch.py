"""The distributed sampler behind torch_xla's ``MpDeviceLoader`` is reshuffled every epoch.

Before the fix the loops could not reach it (``CombinedLoader`` only unwraps a ``DataLoader``), so every epoch of a
``TPUSpawnStrategy`` run saw the first epoch's order (two processes: 0.021 apart from one process after two epochs).
"""
import torch
from torch.utils.data import DataLoader, DistributedSampler

from helpers.runif import RunIf

FIXED_BY = "0022-xla-distributed-sampler-reshuffles-every-epoch.patch"


def _loader() -> DataLoader:
    data = list(range(16))
    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=0, shuffle=True))


@RunIf(xla=True)
def test_trainer_loops_reach_the_sampler():
    from pytorch_lightning.loops.utilities import _set_sampler_epoch
    from pytorch_lightning.strategies import TPUSpawnStrategy
    from pytorch_lightning.trainer.supporters import CombinedLoader

    strategy = TPUSpawnStrategy()
    strategy._launched = True
    loader = strategy.process_dataloader(_loader())
    _set_sampler_epoch(CombinedLoader(loader, "max_size_cycle"), 3)
    assert loader.sampler.epoch == 3
    first = [b.cpu().tolist() for b in loader]
    _set_sampler_epoch(CombinedLoader(loader, "max_size_cycle"), 4)
    assert [b.cpu().tolist() for b in loader] != first


@RunIf(xla=True)
def test_lite_loader_exposes_the_sampler():
    from lightning_lite.strategies import XLAStrategy

    strategy = XLAStrategy()
    strategy._launched = True
    loader = strategy.process_dataloader(_loader())
    loader.sampler.set_epoch(2)
    assert isinstance(loader.sampler, DistributedSampler) and loader.sampler.epoch == 2
    assert torch.is_tensor(next(iter(loader)))
