"""Everyday training patterns on an XLA device: one definition of each, for the benchmark's pattern table
(``bench/graph_bench.py``, rows run by ``bench/bench_rows.py``) and for the tests that hold the fork to its targets
(``tests/tests_pytorch/test_xla_patterns.py``).

Every training pattern is the benchmark's base module (``self.log("train_loss", loss, prog_bar=True)`` every step,
as users do; 1.8.6's progress bar already shows its running loss as ``loss``) plus one thing people write on TPUs: a logged torchmetrics metric, gradient accumulation, manual
optimization with two optimizers, bf16, ``sync_dist=True``. The validation pattern measures ``trainer.validate``
with a ``validation_step`` that logs a torchmetrics metric. Each pattern is written once for the Lightning API that
1.8.6 (the fork) and 2.x (``pytorch_lightning`` 2.6.6) share; the only difference is the name of the bf16 precision
(``"bf16"`` in 1.8.6, ``"bf16-true"`` in 2.x). Each has a hand-written PT/XLA equivalent (:class:`HandLoop`): the
same math with one ``torch_xla.sync()`` per step and the values the progress bar shows read in one transfer after it.

This module never imports Lightning: the caller passes the ``pytorch_lightning`` module it measures.
"""
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

LAYERS = [64, 128, 10]
BATCH = 32
LR = 0.05
SEED = 0


class Pattern:
    """``key``: row key; ``title``: the table's description (markdown); ``per``: what one counted unit is;
    ``phase``: ``fit`` or ``validate``; ``hand``: what the hand-written equivalent does."""

    def __init__(self, key: str, title: str, per: str, phase: str, hand: str):
        self.key, self.title, self.per, self.phase, self.hand = key, title, per, phase, hand


PATTERNS: List[Pattern] = [
    Pattern("log-loss", '`self.log("train_loss", loss, prog_bar=True)`', "step", "fit",
            "reads the loss after the barrier"),
    Pattern("metric-step-epoch", '+ `self.log("acc", self.acc, on_step=True, on_epoch=True)`, torchmetrics '
            '`Accuracy`', "step", "fit", "updates the metric on the device, reads loss and batch accuracy in one "
            "transfer"),
    Pattern("metric-epoch", "+ the same metric, `on_step=False, on_epoch=True`", "step", "fit",
            "updates the metric on the device, reads the loss"),
    Pattern("val-metric", '`validation_step` logging a torchmetrics `Accuracy` (`self.log("val_acc", self.val_acc)`), '
            "`trainer.validate`", "validation batch", "validate",
            "forward and metric update, one barrier per batch, reads nothing"),
    Pattern("accumulate", "+ `accumulate_grad_batches=2`", "batch", "fit",
            "backward every batch, optimizer step every second batch, one barrier and one loss read per batch"),
    Pattern("manual-two-opt", "manual optimization, two optimizers (two models, two losses on the progress bar)",
            "step", "fit", "both updates in one step, reads both losses in one transfer"),
    Pattern("bf16", '+ `precision="bf16"` (2.x: `"bf16-true"`)', "step", "fit",
            "model and inputs in bfloat16, reads the loss"),
    Pattern("sync-dist", '`self.log("train_loss", loss, prog_bar=True, sync_dist=True)`', "step", "fit",
            "one device: nothing to sync, the plain loop"),
]
BY_KEY: Dict[str, Pattern] = {p.key: p for p in PATTERNS}


def get(key: str) -> Pattern:
    if key not in BY_KEY:
        raise KeyError(f"no pattern {key!r}; the patterns are: {', '.join(BY_KEY)}")
    return BY_KEY[key]


# --------------------------------------------------------------------------------------------- model and data
def make_net(layers: List[int] = LAYERS, seed: int = SEED) -> torch.nn.Module:
    torch.manual_seed(seed)
    mods: List[torch.nn.Module] = []
    for i in range(len(layers) - 1):
        mods.append(torch.nn.Linear(layers[i], layers[i + 1]))
        if i < len(layers) - 2:
            mods.append(torch.nn.ReLU())
    return torch.nn.Sequential(*mods)


def make_loader(batches: int, layers: List[int] = LAYERS, batch: int = BATCH) -> DataLoader:
    """Synthetic classification data on the CPU, exactly ``batches`` batches, the same in every process."""
    gen = torch.Generator().manual_seed(SEED + 1)
    n = batches * batch
    x = torch.randn(n, layers[0], generator=gen)
    y = torch.randint(0, layers[-1], (n,), generator=gen)
    return DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=False, drop_last=True)


def endless(loader: DataLoader) -> Iterator:
    """The batches of ``loader``, epoch after epoch: a real DataLoader, as the Trainer uses (collating the batch is
    part of a step's cost)."""
    while True:
        yield from loader


def make_accuracy(num_classes: int = LAYERS[-1]):
    """``torchmetrics.Accuracy`` as the torchmetrics docs write it (micro average, argument checks on)."""
    import torchmetrics

    return torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)


def hlo_has_bf16(tensor: torch.Tensor) -> bool:
    """Whether the graph that computes ``tensor`` (pending, not yet run) computes in bfloat16. Lowering to HLO text
    compiles, executes and transfers nothing."""
    import torch_xla

    return "bf16" in torch_xla._XLAC._get_xla_tensors_hlo([tensor])


# --------------------------------------------------------------------------------------------- Lightning side
def precision_for(key: str, lightning_major: int) -> Any:
    if key == "bf16":
        return "bf16" if lightning_major < 2 else "bf16-true"
    return 32 if lightning_major < 2 else "32-true"


def make_module(pl, key: str, probe: Optional[Callable[[torch.Tensor], None]] = None):
    """The pattern's LightningModule, written for the API that ``pl`` 1.8.6 and 2.x share. ``probe(loss)`` is called
    with the loss of the second training step, before the step's barrier (for the bf16 check)."""
    get(key)

    class PatternModule(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = make_net()
            if key in ("metric-step-epoch", "metric-epoch"):
                self.acc = make_accuracy()
            if key == "val-metric":
                self.val_acc = make_accuracy()
            if key == "manual-two-opt":
                self.automatic_optimization = False
                self.net_b = make_net(seed=SEED + 7)

        def training_step(self, batch, batch_idx):
            x, y = batch
            if key == "manual-two-opt":
                opt_a, opt_b = self.optimizers()
                loss_a = F.cross_entropy(self.net(x), y)
                opt_a.zero_grad()
                self.manual_backward(loss_a)
                opt_a.step()
                loss_b = F.cross_entropy(self.net_b(x), y)
                opt_b.zero_grad()
                self.manual_backward(loss_b)
                opt_b.step()
                self.log("loss_a", loss_a, prog_bar=True)
                self.log("loss_b", loss_b, prog_bar=True)
                return None
            logits = self.net(x)
            loss = F.cross_entropy(logits, y)
            if probe is not None and batch_idx == 1:
                probe(loss)
            self.log("train_loss", loss, prog_bar=True, sync_dist=key == "sync-dist")
            if key == "metric-step-epoch":
                self.acc(logits, y)
                self.log("acc", self.acc, on_step=True, on_epoch=True)
            elif key == "metric-epoch":
                self.acc(logits, y)
                self.log("acc", self.acc, on_step=False, on_epoch=True)
            return loss

        def configure_optimizers(self):
            if key == "manual-two-opt":
                return [torch.optim.SGD(self.net.parameters(), lr=LR), torch.optim.SGD(self.net_b.parameters(), lr=LR)]
            return torch.optim.SGD(self.parameters(), lr=LR)

    if key != "val-metric":
        return PatternModule()

    class ValidationPatternModule(PatternModule):
        # defined only here: a training pattern with a validation_step and no validation data would warn
        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.val_acc(self.net(x), y)
            self.log("val_acc", self.val_acc)

    return ValidationPatternModule()


def run_lightning(pl, key: str, batches: int, on_batch_start: Callable[[], None], on_batch_end: Callable[[], bool],
                  probe: Optional[Callable[[torch.Tensor], None]] = None, root: Optional[str] = None) -> Dict[str, Any]:
    """Run the pattern with ``pl`` on one XLA device (``accelerator="tpu"``) for ``batches`` training (or validation)
    batches, as users run it: progress bar on, the default callbacks, no logger. ``on_batch_start``/``on_batch_end``
    are called around every counted batch; ``on_batch_end`` returning True stops a fit. Returns the values shown on
    the progress bar at the end (``last_loss``) and the Trainer's global step."""
    pattern = get(key)
    major = int(pl.__version__.split(".")[0])

    class Counted(pl.Callback):
        def on_train_batch_start(self, trainer, *args, **kwargs):
            on_batch_start()

        def on_train_batch_end(self, trainer, *args, **kwargs):
            if on_batch_end():
                trainer.should_stop = True

        def on_validation_batch_start(self, trainer, *args, **kwargs):
            if pattern.phase == "validate":
                on_batch_start()

        def on_validation_batch_end(self, trainer, *args, **kwargs):
            if pattern.phase == "validate":
                on_batch_end()

    model = make_module(pl, key, probe=probe)
    with tempfile.TemporaryDirectory(prefix=f"pattern-{key}-") as tmp:
        trainer = pl.Trainer(accelerator="tpu", devices=1, max_epochs=1, logger=False, default_root_dir=root or tmp,
                             precision=precision_for(key, major), callbacks=[Counted()],
                             accumulate_grad_batches=2 if key == "accumulate" else 1)
        if pattern.phase == "validate":
            trainer.validate(model, dataloaders=make_loader(batches), verbose=False)
        else:
            trainer.fit(model, make_loader(batches))
    shown = trainer.progress_bar_metrics
    last = shown.get("train_loss", shown.get("loss_a"))
    return {"last_loss": None if last is None else float(last), "global_step": int(trainer.global_step)}


# --------------------------------------------------------------------------------------------- hand-written side
class HandLoop:
    """The pattern written in plain PyTorch/XLA, one step per :meth:`step`: what the Trainer row is compared with."""

    def __init__(self, key: str, batches: int):
        import torch_xla

        self.key = key
        self.pattern = get(key)
        self.dev = torch_xla.device()
        self.dtype = torch.bfloat16 if key == "bf16" else torch.float32
        self.net = make_net().to(self.dev, self.dtype)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=LR)
        if key == "manual-two-opt":
            self.net_b = make_net(seed=SEED + 7).to(self.dev)
            self.opt_b = torch.optim.SGD(self.net_b.parameters(), lr=LR)
        if key in ("metric-step-epoch", "metric-epoch", "val-metric"):
            self.acc = make_accuracy().to(self.dev)
        self.batches = endless(make_loader(batches))
        self.n = 0
        self.shown: Optional[float] = None
        self.bf16_in_step_graph: Optional[bool] = None

    def step(self, wait: bool = False) -> None:
        """One step (one batch). ``wait``: wait for the device at the end when the step reads nothing (validation),
        so that timing it times its work."""
        import torch_xla

        x, y = next(self.batches)
        x, y = x.to(self.dev, self.dtype), y.to(self.dev)
        self.n += 1
        read: List[torch.Tensor] = []
        if self.key == "val-metric":
            with torch.no_grad():
                self.acc.update(self.net(x), y)
        elif self.key == "manual-two-opt":
            loss_a = F.cross_entropy(self.net(x), y)
            self.opt.zero_grad()
            loss_a.backward()
            self.opt.step()
            loss_b = F.cross_entropy(self.net_b(x), y)
            self.opt_b.zero_grad()
            loss_b.backward()
            self.opt_b.step()
            read = [loss_a, loss_b]
        elif self.key == "accumulate":
            logits = self.net(x)
            loss = F.cross_entropy(logits, y)
            (loss / 2).backward()
            if self.n % 2 == 0:
                self.opt.step()
                self.opt.zero_grad()
            read = [loss]
        else:
            self.opt.zero_grad()
            logits = self.net(x)
            loss = F.cross_entropy(logits, y)
            if self.key == "bf16" and self.n == 2:
                self.bf16_in_step_graph = hlo_has_bf16(loss)
            loss.backward()
            self.opt.step()
            read = [loss]
            if self.key == "metric-step-epoch":
                read.append(self.acc(logits.detach(), y))
            elif self.key == "metric-epoch":
                self.acc.update(logits.detach(), y)
        torch_xla.sync()
        if read:
            # one device-to-host transfer for every value the progress bar would show
            self.shown = float(torch_xla._XLAC._xla_get_cpu_tensors([t.detach() for t in read])[0])
        elif wait:
            import torch_xla.core.xla_model as xm

            xm.wait_device_ops()


# --------------------------------------------------------------------------------------------- targets
def target_failures(key: str, measure: Dict[str, Any]) -> List[str]:
    """What a measured pattern row misses of the fork's targets (issue 12): 0 compilations after warm-up, exactly 1
    execution per step (accumulation: per batch, with nothing left pending between batches for the next graph to
    recompute), at most 1 device-to-host transfer per step (validation: per batch), bf16 in the step graph for the
    bf16 row. An empty list: every target met."""
    per = get(key).per
    out = []
    c, e, t = measure["compiles_per_step"], measure["executions_per_step"], measure["transfers_per_step"]
    if c != 0:
        out.append(f"{c:.2f} compilations per {per} after warm-up (target 0)")
    if abs(e - 1) > 1e-9:
        out.append(f"{e:.2f} executions per {per} (target 1)")
    if t > 1 + 1e-9:
        out.append(f"{t:.2f} transfers per {per} (target at most 1)")
    if key == "accumulate" and measure.get("pending_ir_max"):
        out.append(f"{measure['pending_ir_max']} IR nodes left pending between batches: the next graph recomputes "
                   "them (target 0)")
    if key == "bf16" and not (measure.get("checks") or {}).get("bf16_in_step_graph"):
        out.append("no bf16 in the step graph: it trains in fp32 (target: bf16)")
    return out
