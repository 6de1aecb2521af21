"""Runs on XLA after a given history of the process, for the tests of a TPU run whose process ran a backward pass
on the CPU first. Each history needs a fresh process (``helpers.xla_subprocess.run_python``): PyTorch's autograd
engine creates its device threads once per process, at the first backward pass.

Histories:

- ``fresh``: nothing ran before.
- ``cpu_fit``: a Trainer fit on ``accelerator="cpu"``; torch_xla was not imported.
- ``cpu_lite``: a LightningLite run with a backward pass on ``accelerator="cpu"``; torch_xla was not imported.
- ``import_then_cpu_backward``: ``import torch_xla``, then a plain backward pass on the CPU.
- ``runtime_then_cpu_fit``: the XLA runtime started (``torch_xla.device()``), then a CPU fit.
- ``tpu_fit_then_cpu_fit``: a TPU fit, then a CPU fit.

A run records the final weights, what the steady steps cost (compilations, graph executions, device-to-host
transfers per training step), whether autograd's multithreading was on in the thread that trained, and the messages
Lightning logged.
"""
import json
import logging
import os
import sys
from typing import Any, Dict, List, Optional

import torch

from lightning_lite import LightningLite
from pytorch_lightning import Callback, LightningModule, Trainer
from pytorch_lightning.demos.boring_classes import BoringModel
from pytorch_lightning.strategies import TPUSpawnStrategy

BATCH = 8
STEPS = 8
WARM_UP = 4


def _data() -> List:
    g = torch.Generator().manual_seed(0)
    return list(zip(torch.randn(BATCH * STEPS, 16, generator=g), torch.randint(0, 4, (BATCH * STEPS,), generator=g)))


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


class _Messages(logging.Handler):
    """Collects the messages of Lightning's loggers in this process."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: List[str] = []
        for name in ("pytorch_lightning", "lightning_lite"):
            logger = logging.getLogger(name)
            logger.addHandler(self)
            logger.setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


_MESSAGES: Optional[_Messages] = None


def messages() -> List[str]:
    return list(_MESSAGES.messages) if _MESSAGES else []


def _counters() -> Dict[str, int]:
    from helpers.xla_metrics import XLACounters

    return {
        "compiles": XLACounters.get("CompileTime"),
        "executions": XLACounters.get("ExecuteTime") + XLACounters.get("ExecuteReplicatedTime"),
        "transfers": XLACounters.get("TransferFromDeviceTime"),
    }


def _cpu_backward() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    (x * 2).sum().backward()


def _cpu_fit(tmp_dir: str) -> None:
    trainer = Trainer(accelerator="cpu", max_steps=2, default_root_dir=tmp_dir, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(BoringModel())


def _cpu_lite() -> None:
    Lite(accelerator="cpu").run()


def _model_and_optimizer():
    net = _net()
    return net, torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)


def make_history(history: str, tmp_dir: str) -> Optional[Dict[str, Any]]:
    """Brings this (fresh) process into ``history``; returns the record of the first TPU fit of
    ``tpu_fit_then_cpu_fit``, which ran in a fresh process."""
    global _MESSAGES
    _MESSAGES = _Messages()
    first = None
    if history == "fresh":
        pass
    elif history == "cpu_fit":
        _cpu_fit(tmp_dir)
        assert "torch_xla" not in sys.modules
    elif history == "cpu_lite":
        _cpu_lite()
        assert "torch_xla" not in sys.modules
    elif history == "import_then_cpu_backward":
        import torch_xla  # noqa: F401

        _cpu_backward()
    elif history == "runtime_then_cpu_fit":
        import torch_xla

        torch_xla.device()
        _cpu_fit(tmp_dir)
    elif history == "tpu_fit_then_cpu_fit":
        first = trainer_fit("single", os.path.join(tmp_dir, "first"))
        _cpu_fit(tmp_dir)
    else:
        raise ValueError(history)
    return first


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(_data(), batch_size=BATCH)


class Record(Callback):
    """Runs where the training runs (in the process ``xmp.spawn`` started, for ``spawn``) and writes what it saw to
    ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.record: Dict[str, Any] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 0:
            self.record["multithreading"] = torch.autograd.is_multithreading_enabled()
        if batch_idx == WARM_UP:
            self.record["start"] = _counters()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == STEPS - 1:
            end = _counters()
            self.record["per_step"] = {k: (end[k] - self.record["start"][k]) / (STEPS - WARM_UP) for k in end}

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0:
            self.record["messages"] = messages()
            with open(self.path, "w") as f:
                json.dump(self.record, f)


class Lite(LightningLite):
    def run(self) -> Dict[str, Any]:
        net, opt = _model_and_optimizer()
        model, opt = self.setup(net, opt)
        multithreading = torch.autograd.is_multithreading_enabled()
        for x, y in torch.utils.data.DataLoader(_data(), batch_size=BATCH):
            x, y = x.to(self.device), y.to(self.device)
            opt.zero_grad()
            self.backward(torch.nn.functional.cross_entropy(model(x), y))
            opt.step()
        return {
            "multithreading": multithreading,
            "weights": {k: v.detach().cpu().tolist() for k, v in net.state_dict().items()},
            "messages": messages(),
        }


def trainer_fit(strategy: str, tmp_dir: str) -> Dict[str, Any]:
    """A TPU fit: ``strategy`` is ``single`` (``devices=1``), ``spawn`` (``TPUSpawnStrategy`` on the one device:
    ``xmp.spawn`` forks a process), ``auto`` (``accelerator="auto"`` on a host taken for a TPU host) or an SPMD
    strategy name."""
    os.makedirs(tmp_dir, exist_ok=True)
    record_path = os.path.join(tmp_dir, "record.json")
    kwargs: Dict[str, Any] = {"accelerator": "tpu", "devices": 1}
    if strategy == "spawn":
        kwargs["strategy"] = TPUSpawnStrategy()
    elif strategy == "auto":
        # a TPU host: ``accelerator="auto"`` picks the TPU (it never picks XLA's CPU device otherwise)
        import pytorch_lightning.trainer.connectors.accelerator_connector as connector

        connector._using_xla_cpu = lambda: False
        kwargs = {"accelerator": "auto"}
    elif strategy != "single":
        kwargs = {"accelerator": "tpu", "strategy": strategy}
    model = Model()
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_dir, logger=False, enable_checkpointing=False,
                      enable_model_summary=False, callbacks=[Record(record_path)], **kwargs)
    trainer.fit(model)
    with open(record_path) as f:
        record = json.load(f)
    record["strategy"] = type(trainer.strategy).__name__
    record["weights"] = {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()}
    record["multithreading_after"] = torch.autograd.is_multithreading_enabled()
    return record


def lite_run(strategy: Optional[str]) -> Dict[str, Any]:
    """A LightningLite run on ``accelerator="tpu"`` that trains ``STEPS`` batches: ``strategy=None`` on one device in
    this process; ``"xla"``, the XLA strategy on one device, whose ``xmp.spawn`` forks a process; or an SPMD strategy
    name, on every device of this process."""
    if strategy is None or strategy == "xla":
        kwargs: Dict[str, Any] = {"devices": 1} if strategy is None else {"devices": 1, "strategy": strategy}
    else:
        kwargs = {"strategy": strategy}
    record = Lite(accelerator="tpu", **kwargs).run()
    record["multithreading_after"] = torch.autograd.is_multithreading_enabled()
    return record
