"""Runs of ``precision="bf16-mixed"`` and of float32 on XLA (``tests_pytorch/plugins/precision/test_xla_bf16_mixed.py``,
``tests_lite/plugins/precision/test_xla_bf16_mixed.py``): a small classifier with Adam, on one device, with two
``tpu_spawn`` processes (the harness of ``helpers/gloo_xla_collectives.py``) or under an SPMD strategy on every device
of the process. Each run records what its step computed in (the HLO of the loss, the dtypes of the outputs, the
parameters, the gradients and the optimizer state), the losses, the graph counts of its steady steps and the dtypes
of the checkpoint it wrote."""
import json
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F

from pytorch_lightning import LightningModule

FEATURES, HIDDEN, CLASSES = 16, 64, 4
ROWS, BATCH = 384, 32
STEPS = 12

#: a bfloat16 result of a dot product (``mm``/``linear``) in an HLO module's text
BF16_DOT = re.compile(r"= bf16\[[^\]]*\][^ ]* dot\(")
F32_DOT = re.compile(r"= f32\[[^\]]*\][^ ]* dot\(")


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.GELU(), torch.nn.Linear(HIDDEN, CLASSES))


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(ROWS, FEATURES, generator=g)
    y = (x[:, :CLASSES] * 2 + 0.1 * torch.randn(ROWS, CLASSES, generator=g)).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def _dot_kinds(loss: torch.Tensor) -> Dict[str, int]:
    import torch_xla

    hlo = torch_xla._XLAC._get_xla_tensors_hlo([loss])
    return {"bf16": len(BF16_DOT.findall(hlo)), "f32": len(F32_DOT.findall(hlo))}


def _dtypes(tensors: Any) -> List[str]:
    return sorted({str(t.dtype) for t in tensors})


class Classifier(LightningModule):
    """Records into ``record`` what its first step computed in; rank 0 writes it to ``out/record.json`` at the end
    of ``fit`` (a module at the top level: ``tpu_spawn`` pickles it)."""

    def __init__(self, record: Dict[str, Any], out: str) -> None:
        super().__init__()
        self.net = _net()
        self.record, self.out = record, out
        self.losses: List[torch.Tensor] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        if "dots" not in self.record:
            self.record["dots"] = _dot_kinds(loss)
            self.record["logits_dtype"] = str(logits.dtype)
            self.record["loss_dtype"] = str(loss.dtype)
            self.record["param_dtypes_in_step"] = _dtypes(self.parameters())
        self.losses.append(loss.detach())
        return loss

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.record.setdefault("val_logits_dtype", str(self(x).dtype))

    def on_before_optimizer_step(self, optimizer, optimizer_idx):
        self.record.setdefault("grad_dtypes", _dtypes(p.grad for p in self.parameters() if p.grad is not None))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(_data(), batch_size=BATCH, shuffle=False)

    val_dataloader = train_dataloader

    def on_fit_end(self) -> None:
        state = self.trainer.optimizers[0].state
        self.record["optimizer_state_dtypes"] = _dtypes(
            v for s in state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step")
        self.record["param_dtypes"] = _dtypes(self.parameters())
        self.record["losses"] = [float(v) for v in torch.stack(self.losses).cpu()]
        self.record["precision"] = str(self.trainer.precision)
        if self.trainer.global_rank == 0:
            Path(self.out, "record.json").write_text(json.dumps(self.record))


def _counting(record: Dict[str, Any]) -> Any:
    from helpers.xla_spmd_runs import counters
    from pytorch_lightning import Callback

    class Counting(Callback):
        def on_train_batch_end(self, trainer, *args: Any) -> None:
            # compilations, executions (an SPMD graph counts as a replicated execution) and transfers so far
            record.setdefault("counts", []).append(list(counters().values()))

    return Counting()


def trainer_run(strategy: str, precision: Any, out: str) -> Dict[str, Any]:
    """Fit ``STEPS`` steps on one device (``"single"``), two ``tpu_spawn`` processes or an SPMD strategy; the record
    of the process of rank 0."""
    import contextlib

    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint

    os.makedirs(out, exist_ok=True)
    record: Dict[str, Any] = {}
    host: Any = contextlib.nullcontext()
    callbacks = [ModelCheckpoint(dirpath=os.path.join(out, "ckpts"), save_last=True)]
    if strategy == "single":
        kwargs: Dict[str, Any] = {"devices": 1}
        callbacks.append(_counting(record))
    elif strategy == "tpu_spawn":
        from helpers.gloo_xla_collectives import simulated_tpu_host

        host = simulated_tpu_host(2, Path(out, "harness"), timeout=60.0, deadline=240.0)
        kwargs = {"devices": "auto"}
    else:
        kwargs = {"strategy": strategy}
        callbacks.append(_counting(record))
    with host:
        trainer = Trainer(accelerator="tpu", precision=precision, max_steps=STEPS, limit_val_batches=1,
                          val_check_interval=STEPS, check_val_every_n_epoch=None, num_sanity_val_steps=0,
                          logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=out,
                          callbacks=callbacks, **kwargs)
        trainer.fit(Classifier(record, out))
    record = json.loads(Path(out, "record.json").read_text())
    checkpoint = torch.load(os.path.join(out, "ckpts", "last.ckpt"))
    record["checkpoint_state_dtypes"] = _dtypes(checkpoint["state_dict"].values())
    record["checkpoint_optimizer_dtypes"] = _dtypes(
        v for s in checkpoint["optimizer_states"][0]["state"].values() for k, v in s.items() if k != "step")
    # the file loads into a float32 model of the same class, outside any Trainer
    plain = _net()
    plain.load_state_dict({k[len("net."):]: v for k, v in checkpoint["state_dict"].items()})
    record["loaded_dtypes"] = _dtypes(plain.parameters())
    record["loaded_equal"] = all(torch.equal(p, checkpoint["state_dict"][f"net.{k}"])
                                 for k, p in plain.state_dict().items())
    return record


def lite_run(strategy: Optional[str], precision: Any) -> Dict[str, Any]:
    """The same training with ``LightningLite`` on one device (``strategy=None``) or an SPMD strategy."""
    from lightning_lite import LightningLite

    record: Dict[str, Any] = {}

    class Lite(LightningLite):
        def run(self) -> None:
            model = _net()
            optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
            model, optimizer = self.setup(model, optimizer)
            loader = self.setup_dataloaders(torch.utils.data.DataLoader(_data(), batch_size=BATCH))
            losses = []
            for step, (x, y) in enumerate(loader):
                if step == STEPS:
                    break
                optimizer.zero_grad()
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                if "dots" not in record:
                    record["dots"] = _dot_kinds(loss)
                    record["logits_dtype"] = str(logits.dtype)
                self.backward(loss)
                record.setdefault("grad_dtypes", _dtypes(p.grad for p in model.parameters()))
                optimizer.step()
                losses.append(loss.detach())
            record["param_dtypes"] = _dtypes(model.parameters())
            record["optimizer_state_dtypes"] = _dtypes(
                v for s in optimizer.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step")
            record["losses"] = [float(v) for v in torch.stack(losses).cpu()]
            record["precision"] = str(self._precision.precision)

    kwargs = {"devices": 1} if strategy is None else {"strategy": strategy}
    Lite(accelerator="tpu", precision=precision, **kwargs).run()
    return record
