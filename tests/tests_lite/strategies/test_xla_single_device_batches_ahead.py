"""Lite on one XLA device copies the batches of ``setup_dataloaders`` on a loader thread, ``batches_ahead`` of them
ahead of the loop (fix `xla-single-device-batches-copied-on-loader-threads`), as the Trainer's strategies do: the
loop's thread makes no host-to-device copy in a steady step and never waits for the loader thread, the batches keep
the types the user built, and ``batches_ahead + 1`` batches are on the device at once. A dataloader without workers
is loaded on the loop's thread (its dataset draws from the process's random generators), ``batches_ahead`` batches
beyond the one taken. With 0 the batches are copied on the loop's thread, one at a time, as upstream does;
``move_to_device=False`` leaves them on the host."""
import time
from typing import Any, Dict, List, NamedTuple

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_batch_counts import batches_on_the_device, counted_loader
from helpers.xla_waits import TrainingThreadWaits, waits_of

FIXED_BY = "0061-xla-single-device-batches-copied-on-loader-threads.patch"

ROWS, FEATURES, BATCHES, STEP = 8, 11, 10, 4  # a batch shape no other tensor of the run has; the step measured


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


class _Collate:
    """Makes ``Pair`` batches and counts them (on the thread that loads them)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, rows: List[Any]) -> Pair:
        self.count += 1
        return Pair(torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows]))


def _loader(collate: _Collate) -> torch.utils.data.DataLoader:
    return counted_loader(collate, BATCHES, ROWS, FEATURES)


def _batches_on_the_device() -> int:
    return batches_on_the_device(ROWS, FEATURES)


def _train(ahead: int, move_to_device: bool = True) -> Dict[str, Any]:
    import torch_xla

    from lightning_lite import LightningLite
    from lightning_lite.strategies import SingleTPUStrategy

    seen: Dict[str, Any] = {"types": set(), "devices": set(), "steady": []}

    class Lite(LightningLite):
        def run(self) -> None:
            model = torch.nn.Linear(FEATURES, 3)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = self.setup(model, optimizer)
            collate = _Collate()
            user_loader = _loader(collate)
            loader = self.setup_dataloaders(user_loader, move_to_device=move_to_device)
            # the wrapper is still the user's dataloader to read from, as upstream's is
            seen["attrs"] = (loader.dataset is user_loader.dataset, loader.batch_size, str(loader.device))
            waits = TrainingThreadWaits()
            marks = []
            with waits.counting():
                for i, batch in enumerate(loader):
                    seen["types"].add(type(batch).__name__)
                    seen["devices"].add(batch.x.device.type)
                    if i == STEP and move_to_device:
                        with waits.paused():
                            # no workers: the loop's thread loaded the `ahead` batches after this one when it took it,
                            # and the loader thread copies them
                            full = STEP + ahead + 1
                            deadline = time.monotonic() + 30
                            while _batches_on_the_device() < ahead + 1 and time.monotonic() < deadline:
                                time.sleep(0.01)
                            seen["on_device"] = (_batches_on_the_device(), collate.count - full)
                    x, y = (batch.x, batch.y) if move_to_device else (batch.x.to(self.device), batch.y.to(self.device))
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    self.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                    torch_xla.sync()
                    del x, y  # only the batches the loop and the loader thread hold are counted
                    marks.append(waits.snapshot())
            seen["steady"] = [waits_of(waits.between(a, b)) for a, b in zip(marks[2:-1], marks[3:-1])]

    Lite(accelerator="tpu", devices=1, strategy=SingleTPUStrategy(device=0, batches_ahead=ahead)).run()
    return seen


@RunIf(xla=True)
@pytest.mark.parametrize("ahead", [0, 2])
def test_lite_on_one_device_copies_batches_ahead_on_a_loader_thread(ahead):
    seen = _train(ahead)
    assert seen["types"] == {"Pair"} and seen["devices"] == {"xla"}
    assert seen["attrs"] == (True, ROWS, "xla:0")
    # (batches on the device, batches loaded beyond the bound)
    assert seen["on_device"] == (ahead + 1, 0)
    # with 0 the loop's thread copies each batch itself (both tensors in one copy), with a loader thread it never
    # copies nor waits
    assert seen["steady"] == [1 if ahead == 0 else 0] * len(seen["steady"]) and len(seen["steady"]) == BATCHES - 4


@RunIf(xla=True)
def test_lite_on_one_device_leaves_the_batches_on_the_host_without_move_to_device():
    seen = _train(2, move_to_device=False)
    assert seen["types"] == {"Pair"} and seen["devices"] == {"cpu"}
    assert seen["attrs"] == (True, ROWS, "None")


@RunIf(xla=True)
def test_batches_ahead_of_lite_on_one_device_is_a_count():
    from lightning_lite.strategies import SingleTPUStrategy

    assert SingleTPUStrategy(device=0).batches_ahead == 2
    for wrong in (-1, 1.5, True):
        with pytest.raises(ValueError, match="`batches_ahead` must be an integer >= 0"):
            SingleTPUStrategy(device=0, batches_ahead=wrong)
