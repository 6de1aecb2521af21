"""``broadcast`` on XLA sends an object's pickle through XLA collectives. A buffer of the pickle's own length made the
collective's graph new for every new length: the records that ``tpu_spawn`` processes exchange at each save, whose
length varies, compiled graphs again at saves after the first. The bytes now travel in buffers of power-of-two lengths.
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0087-feature-xla-broadcast-in-buffers-of-few-lengths.patch"


@RunIf(xla=True)
def test_objects_of_new_lengths_reuse_the_broadcasts_graphs():
    import torch_xla.core.xla_model as xm

    from helpers.xla_metrics import XLACounters
    from lightning_lite.strategies.xla import _xla_broadcast_object

    device = xm.xla_device()
    # pickles of 3 lengths under 64 bytes, then of 3 lengths between 65 and 128 (a path, a dict: what a save sends)
    small = ["a", "ab", "abc"]
    larger = [{"step": 1, "path": "x" * 60}, {"step": 2, "path": "x" * 61}, {"step": 3, "path": "x" * 62}]
    compiles = []
    for obj in small + larger:
        before = XLACounters.get("CompileTime")
        assert _xla_broadcast_object(obj, src=0, device=device) == obj
        compiles.append(XLACounters.get("CompileTime") - before)
    # the first of each size class compiles (the length's broadcast, then the bytes'); the others reuse them
    assert compiles[1:3] == [0, 0]
    assert compiles[4:] == [0, 0]
    assert compiles[0] >= 1 and compiles[3] >= 1
