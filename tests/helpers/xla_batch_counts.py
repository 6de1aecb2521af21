"""Counting the batches a loader thread holds: a dataloader of batches of a shape no other tensor of the run has, and
the number of live XLA tensors of that shape (``tests_pytorch/strategies/test_xla_batches_ahead.py``,
``tests_lite/strategies/test_xla_single_device_batches_ahead.py``)."""
import gc
from typing import Any, Callable, List

import torch


def counted_loader(collate: Callable[[List[Any]], Any], batches: int, rows: int, features: int
                   ) -> torch.utils.data.DataLoader:
    """``batches`` batches of ``rows`` rows (``features`` inputs and a class each), made by ``collate``."""
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(batches * rows, features, generator=g),
                                          torch.randint(0, 3, (batches * rows,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=rows, collate_fn=collate)


def batches_on_the_device(rows: int, features: int) -> int:
    """The live XLA tensors shaped ``(rows, features)``: the inputs of the batches on the device."""
    gc.collect()
    return sum(1 for obj in gc.get_objects()
               if isinstance(obj, torch.Tensor) and obj.device.type == "xla" and tuple(obj.shape) == (rows, features))
