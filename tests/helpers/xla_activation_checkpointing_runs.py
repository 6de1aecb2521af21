"""Runs with and without ``activation_checkpointing_policy`` under the SPMD strategies
(``tests_pytorch/strategies/test_xla_spmd_activation_checkpointing.py``, ``tests_lite/strategies/
test_xla_spmd_activation_checkpointing.py``): a small stack of residual blocks on 4 XLA:CPU devices, recording the
first step's gradients, the optimization barriers in their HLO (the mark of torch_xla's recomputation in the backward),
the state dict's names and what the checkpoint holds."""
import functools
import os
from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pytorch_lightning import LightningModule

VOCAB, WIDTH, LAYERS, SEQUENCE, BATCH = 96, 32, 3, 32, 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.ModuleDict({"embed": nn.Embedding(VOCAB, WIDTH), "blocks": nn.Sequential(*[Block() for _ in range(LAYERS)]),
                          "head": nn.Linear(WIDTH, VOCAB)})


def _loss(net: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = net["head"](net["blocks"](net["embed"](tokens)))
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randint(0, VOCAB, (4 * BATCH, SEQUENCE), generator=g))


def _barriers(tensors: List[torch.Tensor]) -> int:
    import torch_xla

    return torch_xla._XLAC._get_xla_tensors_hlo(tensors).count("opt-barrier(")


class Stack(LightningModule):
    def __init__(self, record: Dict[str, Any]) -> None:
        super().__init__()
        self.net = _net()
        self.record = record

    def training_step(self, batch, batch_idx):
        return _loss(self.net, batch[0])

    def on_before_optimizer_step(self, optimizer, optimizer_idx):
        if "grads" not in self.record:
            grads = {n: p.grad for n, p in self.named_parameters()}
            self.record["barriers"] = _barriers(list(grads.values()))
            self.record["grads"] = {n: g.detach().cpu().flatten().tolist() for n, g in grads.items()}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(_data(), batch_size=BATCH)


def trainer_run(strategy: str, checkpointing: bool, root: str, precision: Any = 32, wrap: bool = False
                ) -> Dict[str, Any]:
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.strategies import StrategyRegistry

    options: Dict[str, Any] = {"activation_checkpointing_policy": {Block}} if checkpointing else {}
    if wrap:
        options["auto_wrap_policy"] = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    record: Dict[str, Any] = {}
    module = Stack(record)
    trainer = Trainer(accelerator="tpu", strategy=StrategyRegistry[strategy]["strategy"](**options),
                      precision=precision, max_steps=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=root,
                      callbacks=[ModelCheckpoint(dirpath=os.path.join(root, "ckpts"), save_last=True)])
    trainer.fit(module)
    record["state_dict_keys"] = sorted(module.state_dict())
    # torch_xla's `checkpoint_module` replaces the instance's `forward` (a wrapper forwards attribute lookups)
    record["recomputed"] = sorted(n for n, m in module.named_modules() if "_xla_checkpointed_forward_original" in vars(m))
    checkpoint = torch.load(os.path.join(root, "ckpts", "last.ckpt"))
    plain = _net()
    plain.load_state_dict({k[len("net."):]: v for k, v in checkpoint["state_dict"].items()})
    record["loads_into_the_plain_model"] = True
    return record


def lite_run(strategy: str, checkpointing: bool) -> Dict[str, Any]:
    from lightning_lite import LightningLite
    from lightning_lite.strategies import XLASPMDFSDPStrategy, XLASPMDStrategy

    record: Dict[str, Any] = {}
    cls = XLASPMDFSDPStrategy if strategy == "xla_spmd_fsdp" else XLASPMDStrategy

    class Lite(LightningLite):
        def run(self) -> None:
            net = self.setup(_net())
            tokens = next(iter(self.setup_dataloaders(torch.utils.data.DataLoader(_data(), batch_size=BATCH))))[0]
            self.backward(_loss(net.module, tokens))
            grads = {n: p.grad for n, p in net.named_parameters()}
            record["barriers"] = _barriers(list(grads.values()))
            record["grads"] = {n: g.detach().cpu().flatten().tolist() for n, g in grads.items()}
            record["state_dict_keys"] = sorted(net.state_dict())

    options: Dict[str, Any] = {"activation_checkpointing_policy": {Block}} if checkpointing else {}
    Lite(accelerator="tpu", strategy=cls(**options)).run()
    return record


def max_difference(a: Dict[str, List[float]], b: Dict[str, List[float]]) -> Optional[float]:
    """The largest difference between two runs' gradients, or None when they name other parameters."""
    if sorted(a) != sorted(b):
        return None
    return max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)


def trainer_runs(root: str) -> Dict[str, Any]:
    """Each SPMD strategy with and without checkpointing, and FSDPv2 with wrapped blocks under ``bf16-mixed`` (the
    large-model setup) with and without it."""
    runs = {f"{s}-{c}": trainer_run(s, c, f"{root}/{s}-{c}") for s in ("xla_spmd", "xla_spmd_fsdp") for c in (False, True)}
    for c in (False, True):
        runs[f"wrapped-bf16-mixed-{c}"] = trainer_run("xla_spmd_fsdp", c, f"{root}/wrapped-{c}", "bf16-mixed", wrap=True)
    return runs
