"""Batches of every collection type a user builds, and what the steps see of them (``test_xla_batch_types.py``).

``collate`` builds, from rows of features and labels, a ``Batch`` namedtuple that holds a namedtuple, a plain tuple,
a dict subclass, a dataclass, an object with its own ``.to()`` (a ``_TransferableDataType``), a nested mixture of
them, a string and non-tensor leaves. ``layout`` describes a batch as JSON: every collection's type, every tensor's
device type, every other leaf's repr. Upstream's ``move_data_to_device`` keeps every type and moves every tensor and
every object with ``.to()``: ``expected_layout`` is the host batch's layout with each tensor on ``"xla"``.

``BatchTypesModule`` records the layout of the batch that ``training_step``, ``validation_step``, ``test_step`` and
``predict_step`` get, per hook; it reads no tensor value, so recording costs no host read.
"""
import dataclasses
import json
from collections import namedtuple, OrderedDict
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytorch_lightning as pl
import torch
from lightning_lite import LightningLite

BATCH, FEATURES, CLASSES = 8, 6, 3

Batch = namedtuple("Batch", ["pair", "plain", "features", "sample", "boxes", "nested", "name", "count"])
Pair = namedtuple("Pair", ["x", "y"])


class Features(dict):
    """A dict subclass of the user's own."""


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    tag: str
    index: int


class Boxes:
    """An object that moves itself with ``.to()``, as upstream's ``_TransferableDataType`` expects."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def to(self, device: Any, **kwargs: Any) -> "Boxes":
        return Boxes(self.tensor.to(device, **kwargs))


def collate(rows: List[Any]) -> Batch:
    x = torch.stack([r[0] for r in rows])
    y = torch.stack([r[1] for r in rows])
    return Batch(
        pair=Pair(x, y),
        plain=(x, y),
        features=Features(x=x, y=y),
        sample=Sample(x=x, tag="rows", index=3),
        boxes=Boxes(x),
        nested=[Pair(x, (y, Features(z=x, w=OrderedDict(y=y)))), {"text": "a string", "ratio": 1.5, "none": None}],
        name="batch",
        count=7,
    )


def dataset(rows: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(3)
    return torch.utils.data.TensorDataset(torch.randn(rows, FEATURES, generator=g),
                                          torch.randint(0, CLASSES, (rows,), generator=g))


def loader(batches: int, **kwargs: Any) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset(batches * BATCH), batch_size=BATCH, collate_fn=collate, **kwargs)


def layout(obj: Any) -> Any:
    """The JSON description of ``obj``'s types, tensors' device types and leaves."""
    kind = type(obj).__qualname__
    if isinstance(obj, torch.Tensor):
        return f"Tensor@{obj.device.type}"
    if isinstance(obj, Boxes):
        return [kind, layout(obj.tensor)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [kind, {f.name: layout(getattr(obj, f.name)) for f in dataclasses.fields(obj)}]
    if isinstance(obj, dict):
        return [kind, {str(k): layout(v) for k, v in obj.items()}]
    if isinstance(obj, (list, tuple)):
        return [kind, [layout(v) for v in obj]]
    return [kind, repr(obj)]


def expected_layout() -> Any:
    """What upstream's ``move_data_to_device`` gives on an XLA device: the same types, every tensor on the device."""

    def on_device(node: Any) -> Any:
        if node == "Tensor@cpu":
            return "Tensor@xla"
        if isinstance(node, list):
            return [on_device(v) for v in node]
        if isinstance(node, dict):
            return {k: on_device(v) for k, v in node.items()}
        return node

    return on_device(layout(collate([dataset(BATCH)[i] for i in range(BATCH)])))


class BatchTypesModule(pl.LightningModule):
    """Trains on ``batch.pair``; every step records the layout of its batch under its hook's name."""

    def __init__(self, out_dir: Optional[str] = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(FEATURES, CLASSES)
        self.seen: Dict[str, List[Any]] = {}
        # spawned processes: each rank also writes what it saw to `seen-rank<r>.json` there
        self.out_dir = out_dir

    def _record(self, hook: str, batch: Any) -> None:
        found = layout(batch)
        if found in self.seen.setdefault(hook, []):
            return
        self.seen[hook].append(found)
        if self.out_dir is not None:
            path = Path(self.out_dir, f"seen-rank{self.global_rank}.json")
            seen = json.loads(path.read_text()) if path.exists() else {}
            if found not in seen.setdefault(hook, []):
                seen[hook].append(found)
                path.write_text(json.dumps(seen))

    def _loss(self, batch: Any) -> torch.Tensor:
        x, y = batch.pair
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self._record("training_step", batch)
        return self._loss(batch)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._record("validation_step", batch)
        self.log("val_loss", self._loss(batch))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._record("test_step", batch)
        self.log("test_loss", self._loss(batch))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        self._record("predict_step", batch)
        return self.net(batch.pair.x)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


HOOKS = ("training_step", "validation_step", "test_step", "predict_step")


def trainer_run(trainer_factory: Any, batches: int = 4, out_dir: Optional[str] = None) -> Dict[str, List[Any]]:
    """``fit`` (with validation), ``validate``, ``test`` and ``predict`` with ``trainer_factory()``'s Trainers; the
    layouts each hook saw (in this process: see ``BatchTypesModule.out_dir`` for spawned ones)."""
    module = BatchTypesModule(out_dir)
    trainer_factory(max_steps=batches, limit_val_batches=2).fit(module, loader(batches), loader(2))
    trainer_factory().validate(module, loader(2))
    trainer_factory().test(module, loader(2))
    trainer_factory().predict(module, loader(2))
    return module.seen


def lite_run(lite: Any, batches: int = 3) -> List[Any]:
    """The layouts of the batches of a dataloader set up with ``lite.setup_dataloaders``, one step each."""
    seen: List[Any] = []
    for batch in lite.setup_dataloaders(loader(batches)):
        found = layout(batch)
        if found not in seen:
            seen.append(found)
    return seen


def trainer_kwargs(root: str) -> Dict[str, Any]:
    return dict(logger=False, enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                default_root_dir=root)


class LayoutsLite(LightningLite):
    """``run()`` returns the layouts of ``lite_run``; ``run(out_dir)`` (spawned processes) writes each rank's to
    ``lite-rank<r>.json`` there."""

    def run(self, out_dir: Optional[str] = None) -> Optional[List[Any]]:
        seen = lite_run(self)
        if out_dir is None:
            return seen
        Path(out_dir, f"lite-rank{self.global_rank}.json").write_text(json.dumps(seen))
        return None


def lite_layouts(**kwargs: Any) -> List[Any]:
    """``lite_run`` in ``LightningLite(**kwargs)``, in this process."""
    return LayoutsLite(**kwargs).run()
