"""One row of the graph benchmark, run in its own process.

``bench.graph_bench`` starts this module once per row (the hand-written loops, which import no Lightning, share one
process), with ``PYTHONPATH`` pointing at the Lightning tree the row measures (a partial fork tree, the full fork,
Lightning 2.6.6, or none for the hand-written loops: ``bench.trees``)::

    python -m bench.bench_rows --spec SPEC.json --out RESULT.json

For every model size named in the spec, the process trains the hand-written PT/XLA loop (the in-process reference)
right before and right after each row, on the same model, data and optimizer. Per-step counters come from
``torch_xla.debug.metrics``; the result (raw numbers and per-step times) is written as JSON to ``--out``.

This module never imports Lightning at import time: the row decides which tree it imports.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from . import patterns

# Model sizes. "small": overhead dominates (a step is a few microseconds of math). "heavy": a wide MLP whose
# step costs several times Lightning's per-step Python work on XLA:CPU (see bench/README.md for the measurement).
SIZES: Dict[str, Dict[str, Any]] = {
    "small": {"layers": [64, 128, 10], "batch": 32, "steps": 200, "warmup": 30},
    "heavy": {"layers": [512, 1024, 1024, 10], "batch": 128, "steps": 60, "warmup": 10},
    # the pattern table (bench/patterns.py): the small MLP; counts per step (or per batch) are what it is about
    "pattern": {"layers": [64, 128, 10], "batch": 32, "steps": 60, "warmup": 20},
}
LR = 0.05
SEED = 0


# --------------------------------------------------------------------------------------------- shared pieces
def host_work(ms: float) -> None:
    """Python work on the host for ``ms`` milliseconds, holding the GIL as a user's own step code does (decoding,
    augmenting, computing a metric in Python): the host time per step of ``make bench-device``'s sweep."""
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1e3
    n = 0
    while time.perf_counter() < end:
        n += 1


def make_net(layers: List[int]) -> torch.nn.Module:
    """The MLP of the benchmark (``bench/patterns.py`` builds it, for the pattern table too)."""
    return patterns.make_net(layers, SEED)


def make_loader(layers: List[int], batch: int, steps: int) -> DataLoader:
    """Synthetic classification data on the CPU, exactly ``steps`` batches, the same in every process."""
    return patterns.make_loader(steps, layers, batch)


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR)


def xla_counts() -> List[int]:
    import torch_xla.debug.metrics as met

    out = []
    for name in ("CompileTime", "ExecuteTime", "TransferFromDeviceTime"):
        data = met.metric_data(name)
        out.append(0 if data is None else int(data[0]))
    return out


def _wait_for_host_copies() -> None:
    """Let the copies to the host that the fork's Trainer makes on its copying thread land: a step's copy is made
    while the next step runs, and one still in flight at either end of the steady state would be counted in the
    window or not depending on how far that thread got. Other rows (the hand loops, Lightning 2.6.6) have none."""
    if "pytorch_lightning" not in sys.modules:
        return
    try:
        from pytorch_lightning.utilities.xla_host_transfers import wait_for_host_copies
    except ImportError:
        return
    wait_for_host_copies()


def step_barrier() -> None:
    """``xm.mark_step()``: cut the lazy graph and run it. torch_xla 2.9 names it ``torch_xla.sync()``."""
    import torch_xla

    if hasattr(torch_xla, "sync"):
        torch_xla.sync()
    else:  # older torch_xla
        import torch_xla.core.xla_model as xm

        xm.mark_step()


def hand_step(net: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
              dev: torch.device) -> torch.Tensor:
    """One step of the hand-written loop: the batch to ``dev``, forward, backward, ``optimizer.step()`` and, on XLA,
    the step barrier. Returns the loss (not read)."""
    x, y = x.to(dev), y.to(dev)
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    if dev.type == "xla":
        step_barrier()
    return loss


class Recorder:
    """Timestamps and cumulative XLA counters at the end of every step.

    On XLA the host runs ahead of the device, so the recorder waits for the device (``xm.wait_device_ops``, which
    neither compiles, executes nor transfers anything) at the two ends of the steady state: after the last
    warm-up step and after the last step. Every row is measured between the same two synchronised points.
    """

    def __init__(self, xla: bool, warmup: int, steps: int, budget_s: float,
                 partner: Optional["PairedReference"] = None, settle: Optional[Callable[[], None]] = None):
        self.xla = xla
        # the row's own work that lands after its barrier (torch_xla's asynchronous step closures): waited for at
        # the two ends of the steady state, so that a late one is not counted in the window or left out by chance
        self.settle = settle
        self.warmup = warmup
        self.steps = steps
        self.budget_s = budget_s
        self.partner = partner
        # [t, compiles, executions, transfers, host CPU t] after each step, the paired steps' share taken out
        self.marks: List[List[float]] = []
        # [k, seconds, compiles, executions, transfers, host CPU seconds] of each paired step run after row step k
        self.partner_marks: List[List[float]] = []
        self.final: Optional[List[float]] = None
        # [seconds, compiles, executions, transfers, host CPU seconds] that the paired steps took: left out of the
        # row's own marks
        self.excluded = [0.0, 0, 0, 0, 0.0]
        self.unpaired_why: Optional[str] = None
        self.t0 = time.perf_counter()
        self.stopped_by_budget = False
        # the most IR nodes left pending at a step boundary in the steady state (see note_pending), or None
        self.pending_ir_max: Optional[int] = None

    def _sync(self) -> None:
        if self.xla:
            import torch_xla.core.xla_model as xm

            xm.wait_device_ops()
            _wait_for_host_copies()
        if self.settle is not None:
            self.settle()

    def _mark(self) -> List[float]:
        # time.thread_time(): CPU time of this (the host's Python) thread, not of the runtime's threads that run
        # the XLA:CPU "device"
        now = [time.perf_counter(), *(xla_counts() if self.xla else [0, 0, 0]), time.thread_time()]
        return [v - e for v, e in zip(now, self.excluded)]

    def note_pending(self) -> None:
        """Call at a step boundary: record how much work the row left pending on the device (IR nodes beyond device
        data, which the next graph would have to compute again). Steady state only; its time is left out."""
        if not self.xla or len(self.marks) < self.warmup or self.final is not None:
            return
        t0, cpu0 = time.perf_counter(), time.thread_time()
        self.pending_ir_max = max(self.pending_ir_max or 0, pending_ir_nodes())
        self.excluded[0] += time.perf_counter() - t0
        self.excluded[4] += time.thread_time() - cpu0

    def pair(self) -> None:
        """Call at every step boundary, where the row has no work queued on the device (its step's host read is
        done). After every ``PAIR_BLOCK`` steps of the row, run as many steps of the paired reference, and leave them
        out of the row's time and counters."""
        k = len(self.marks)
        if self.partner is None or k == 0 or k % PAIR_BLOCK or self.final is not None:
            return
        t0, cpu0 = time.perf_counter(), time.thread_time()
        pending = pending_device_work()
        if pending:
            # the reference's barrier would run the row's pending work (and change what the row does): no pairing
            self.unpaired_why = (f"not paired: after step {k} the row had work pending on the device, which the "
                                 f"paired steps' barrier would have run ({pending})")
            self.partner = None
            self.partner_marks = []
            self.excluded[0] += time.perf_counter() - t0
            self.excluded[4] += time.thread_time() - cpu0
            return
        if self.xla:
            # the row's last execution is counted by the runtime's thread, and its last copy to the host by the
            # fork's copying thread: let both land in the row's counters
            import torch_xla.core.xla_model as xm

            xm.wait_device_ops()
            _wait_for_host_copies()
        for _ in range(PAIR_BLOCK):
            took = self.partner.step()
            # paired with the row's steps k-PAIR_BLOCK+1 .. k
            self.partner_marks.append([k] + took)
            # the counters of an XLA row are cumulative over the process: take the paired step's share out
            if self.xla:
                for i in (1, 2, 3):
                    self.excluded[i] += took[i]
        # the whole block (counter reads and waits included) is left out of the row's time and host CPU time
        self.excluded[0] += time.perf_counter() - t0
        self.excluded[4] += time.thread_time() - cpu0

    def step_end(self) -> bool:
        """Record one finished step; return True when the run should stop (all steps done, or over budget)."""
        if self.final is not None:
            return True
        k = len(self.marks)
        if k == self.warmup - 1:
            self._sync()
        self.marks.append(self._mark())
        over = time.perf_counter() - self.t0 > self.budget_s
        if len(self.marks) >= self.steps or over:
            self.stopped_by_budget = over and len(self.marks) < self.steps
            self.finish()
            return True
        return False

    def finish(self) -> None:
        if self.final is None and self.marks:
            self._sync()
            self.final = self._mark()

    def summary(self) -> Dict[str, Any]:
        self.finish()
        n_done = len(self.marks)
        if n_done < 2:
            raise RuntimeError(f"only {n_done} step(s) finished; nothing to measure")
        warmup = self.warmup
        note = None
        if n_done - warmup < 2:
            # the run was stopped early (time budget): measure the second half of what finished
            warmup = max(1, n_done // 2)
            note = f"stopped by the time budget after {n_done} steps; steady state = steps {warmup}..{n_done}"
        elif self.stopped_by_budget:
            note = f"stopped by the time budget after {n_done} of {self.steps} steps"
        start = self.marks[warmup - 1]
        end = self.final
        n = n_done - warmup
        # per-step durations; the last one ends at the synchronised final mark
        times = [self.marks[0][0] - self.t0] + [self.marks[i][0] - self.marks[i - 1][0] for i in range(1, n_done)]
        times[-1] = end[0] - (self.marks[-2][0] if n_done >= 2 else self.t0)
        steady = times[warmup:]
        k = min(10, len(steady) // 2) or 1
        first, last = sum(steady[:k]) / k, sum(steady[-k:]) / k
        q = min(max(10, len(steady) // 4), len(steady) // 2) or 1
        first_med, last_med = statistics.median(steady[:q]), statistics.median(steady[-q:])
        paired = None
        # a block of reference steps ran after the row's step k; it pairs with the row's steps k-PAIR_BLOCK+1 .. k.
        # Only whole blocks inside the steady state count (times[i] is the row's step i+1).
        blocks: Dict[int, List[List[float]]] = {}
        for m in self.partner_marks:
            if m[0] - PAIR_BLOCK >= warmup and m[0] <= n_done:
                blocks.setdefault(int(m[0]), []).append(m[1:])
        if blocks:
            row_block_s = {k: sum(times[k - PAIR_BLOCK:k]) for k in blocks}
            ref_block_s = {k: sum(m[0] for m in ref) for k, ref in blocks.items()}
            ref = [m for refs in blocks.values() for m in refs]
            row_s, ref_s = sum(row_block_s.values()), sum(ref_block_s.values())
            paired = {
                "block": PAIR_BLOCK,
                "steps": len(ref),
                "ratio": row_s / ref_s if ref_s > 0 else None,
                "block_ratios": [row_block_s[k] / ref_block_s[k] for k in sorted(blocks)],
                "row_s_per_step": row_s / len(ref),
                "reference_s_per_step": ref_s / len(ref),
                "reference_counts_per_step": [sum(m[i] for m in ref) / len(ref) for i in (1, 2, 3)],
                "reference_host_cpu_s_per_step": sum(m[4] for m in ref) / len(ref),
            }
        return {
            "paired": paired,
            "unpaired_why": self.unpaired_why,
            "steps_done": n_done,
            "steps_planned": self.steps,
            "warmup": warmup,
            "steady_steps": n,
            "compiles_per_step": (end[1] - start[1]) / n,
            "executions_per_step": (end[2] - start[2]) / n,
            "transfers_per_step": (end[3] - start[3]) / n,
            "s_per_step": (end[0] - start[0]) / n,
            "host_cpu_s_per_step": (end[4] - start[4]) / n,
            "drift": last / first if first > 0 else None,
            "drift_window": k,
            "drift_median": last_med / first_med if first_med > 0 else None,
            "drift_median_window": q,
            "step_times": times,
            "warmup_compiles": start[1],
            "note": note,
            "pending_ir_max": self.pending_ir_max,
        }


def _pending_ops() -> List[str]:
    import torch_xla

    report = torch_xla._XLAC._xla_tensors_report(0, str(torch_xla.device()))
    return [line.split("=", 1)[1].split("(")[0].strip().split()[-1] for line in report.splitlines()
            if line.strip().startswith("%") and "xla::device_data" not in line]


def pending_ir_nodes() -> int:
    """IR nodes beyond device data held by live XLA tensors: work the next barrier would run (nothing is compiled,
    executed or transferred to count them)."""
    return len(_pending_ops())


def pending_device_work() -> Optional[str]:
    """A short description of the tensors that have work pending on the XLA device (IR beyond device data), or
    None. Nothing is compiled, executed or transferred to find out."""
    ops = _pending_ops()
    if not ops:
        return None
    return f"{len(ops)} IR nodes, e.g. {', '.join(sorted(set(ops))[:4])}"


#: steps of the row, then as many steps of the paired reference, in turn (see PairedReference)
PAIR_BLOCK = 10


class PairedReference:
    """The hand-written PT/XLA loop, one step at a time, run between the steps of a row.

    The machine's speed moves by 20 % and more from one second to the next (2 shared cores), so a reference
    measured before or after a row, or in another process, cannot resolve differences of a few percent. After every
    ``PAIR_BLOCK`` steps of a row, as many steps of the hand-written XLA loop run, and the row's time is reported
    as a ratio to its paired steps: both see the same machine at nearly the same moments. (Alternating single
    steps slowed the wide MLP by 15 %: each model evicts the other's weights from the caches.)

    The paired step is the hand loop's step: forward, backward, ``optimizer.step()``, the barrier, then the host
    read of the loss. Its barrier runs everything pending on the device, so a row that leaves work pending at its
    step boundary (1.8.6 before the fixes keeps a growing graph unmaterialized) is not paired: the
    :class:`Recorder` checks for pending work before every block of paired steps, and :func:`measure_row` then
    falls back to two runs of the hand loop after the row. The ``xla-loop`` row, paired with itself, shows what
    pairing does to a ratio that should be 1.00.
    """

    def __init__(self, size: Dict[str, Any]):
        import torch_xla

        self.dev = torch_xla.device()
        self.net = make_net(size["layers"]).to(self.dev)
        self.opt = make_optimizer(self.net.parameters())
        self.batches = patterns.endless(make_loader(size["layers"], size["batch"], size["steps"]))

    def _one_step(self) -> None:
        x, y = next(self.batches)
        hand_step(self.net, self.opt, x, y, self.dev).item()

    def step(self) -> List[float]:
        """One step; returns [seconds, compiles, executions, transfers, host CPU seconds] it took."""
        import torch_xla.core.xla_model as xm

        c0 = xla_counts()
        t0, cpu0 = time.perf_counter(), time.thread_time()
        self._one_step()
        t1, cpu1 = time.perf_counter(), time.thread_time()
        # the execution counter is updated by the runtime's thread; let it land before reading the counters
        xm.wait_device_ops()
        return [t1 - t0, *[b - a for a, b in zip(c0, xla_counts())], cpu1 - cpu0]


# --------------------------------------------------------------------------------------------- hand-written loops
def hand_loop(size: Dict[str, Any], device: str, budget_s: float, read_loss: bool = True,
              partner: Optional[PairedReference] = None) -> Dict[str, Any]:
    """The plain PyTorch / PT-XLA loop: forward, backward, optimizer.step, then the step barrier.

    ``read_loss``: read the loss on the host every step, AFTER the barrier (``xm.mark_step``). The step's graph
    has then already run, so the read is one device-to-host transfer and no extra execution. Lightning's
    progress bar shows the loss every step, so the reference does the same host read (see bench/README.md).
    """
    xla = device == "xla"
    if xla:
        import torch_xla

        dev = torch_xla.device()
    else:
        dev = torch.device("cpu")
    net = make_net(size["layers"]).to(dev)
    opt = make_optimizer(net.parameters())
    loader = make_loader(size["layers"], size["batch"], size["steps"])
    rec = Recorder(xla, size["warmup"], size["steps"], budget_s, partner)
    shown = None
    for x, y in loader:
        rec.pair()
        loss = hand_step(net, opt, x, y, dev)
        if read_loss:
            shown = loss.item()
        if rec.step_end():
            break
    out = rec.summary()
    out["last_loss"] = shown
    return out


# --------------------------------------------------------------------------------------------- Lightning rows
def make_module_class(pl):
    class BenchModule(pl.LightningModule):
        """The benchmark model as users write it: logs its loss on the progress bar every step."""

        def __init__(self, layers: List[int], host_ms: float = 0.0):
            super().__init__()
            self.net = make_net(layers)
            self.host_ms = host_ms

        def training_step(self, batch, batch_idx):
            if self.host_ms:  # only the device benchmark's sweep adds work: the host benchmarks time this step
                host_work(self.host_ms)
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return make_optimizer(self.parameters())

    return BenchModule


def _make_callback(pl, rec: Recorder):
    class StepRecorder(pl.Callback):
        def on_train_batch_start(self, trainer, *args, **kwargs):
            # the previous step is over, its host reads (progress bar) included: the device is idle
            rec.pair()

        def on_train_batch_end(self, trainer, *args, **kwargs):
            if rec.step_end():
                trainer.should_stop = True

    return StepRecorder()


def _trainer_kwargs(accelerator: str, size: Dict[str, Any], root: str, callback) -> Dict[str, Any]:
    # The same for every Trainer row: progress bar on (default), default callbacks (checkpointing into a temp
    # dir, model summary), no logger (self.log still feeds the progress bar), one device.
    return dict(accelerator=accelerator, devices=1, max_steps=size["steps"], max_epochs=1, logger=False,
                default_root_dir=root, callbacks=[callback])


def trainer_row(size: Dict[str, Any], accelerator: str, budget_s: float,
                partner: Optional[PairedReference] = None) -> Dict[str, Any]:
    import pytorch_lightning as pl

    rec_xla = accelerator == "tpu"
    loader = make_loader(size["layers"], size["batch"], size["steps"])
    model = make_module_class(pl)(size["layers"], size.get("host_ms", 0.0))
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as root:
        rec = Recorder(rec_xla, size["warmup"], size["steps"], budget_s, partner)
        trainer = pl.Trainer(**_trainer_kwargs(accelerator, size, root, _make_callback(pl, rec)))
        rec.t0 = time.perf_counter()
        trainer.fit(model, loader)
        t_fit_end = time.perf_counter()
    out = rec.summary()
    # what fit() spent after the last measured step (end of epoch, checkpoint, teardown): not in s/step
    out["after_last_step_s"] = t_fit_end - rec.final[0] if rec.final else None
    out["last_loss"] = _as_float(trainer.progress_bar_metrics.get("train_loss"))
    return out


def lite_row(size: Dict[str, Any], budget_s: float, partner: Optional[PairedReference] = None) -> Dict[str, Any]:
    """LightningLite from the fork, accelerator="tpu", devices=1, written as the Lite docs of 1.8 show it."""
    from lightning_lite import LightningLite

    result: Dict[str, Any] = {}

    class BenchLite(LightningLite):
        def run(self):
            net = make_net(size["layers"])
            opt = make_optimizer(net.parameters())
            net, opt = self.setup(net, opt)
            loader = self.setup_dataloaders(make_loader(size["layers"], size["batch"], size["steps"]))
            rec = Recorder(True, size["warmup"], size["steps"], budget_s, partner)
            shown = None
            for x, y in loader:
                rec.pair()
                opt.zero_grad()
                loss = F.cross_entropy(net(x), y)
                self.backward(loss)
                opt.step()
                shown = loss.item()  # what the hand loop reads, at the same point of the step
                if rec.step_end():
                    break
            result.update(rec.summary())
            result["last_loss"] = shown

    BenchLite(accelerator="tpu", devices=1).run()
    return result


def _as_float(v) -> Optional[float]:
    try:
        return float(v)
    except Exception:
        return None


def pl266_device_override() -> Optional[str]:
    """Lightning 2.x counts TPU chips only; on XLA:CPU tell its XLAAccelerator that one device is there."""
    try:
        from torch_xla._internal import tpu

        chips = int(tpu.num_available_chips())
    except Exception:
        chips = 0
    if chips > 0:
        return None
    from lightning_fabric.accelerators import xla as fabric_xla

    fabric_xla.XLAAccelerator.auto_device_count = staticmethod(lambda: 1)
    fabric_xla.XLAAccelerator.is_available = staticmethod(lambda: True)
    return ("no TPU chip here: the benchmark patched Lightning 2.6.6's XLAAccelerator.is_available/auto_device_count "
            f"to report 1 device, so it runs on the XLA device of PJRT_DEVICE={os.environ.get('PJRT_DEVICE')}")


# --------------------------------------------------------------------------------------------- pattern rows
class PatternReference(PairedReference):
    """The pattern's own hand-written loop (patterns.HandLoop) as the paired reference of a pattern row. It is built
    at its first step (inside the row's warm-up), so the row's Lightning is the first to put tensors on the XLA
    device, as in a user's script (torch_xla reads some settings, ``XLA_USE_BF16`` among them, at the first XLA
    tensor). A step that reads nothing (validation) waits for the device, so its time is its work."""

    def __init__(self, key: str, batches: int):
        self.key, self.n_batches = key, batches
        self.hand = None

    def _one_step(self) -> None:
        if self.hand is None:
            self.hand = patterns.HandLoop(self.key, self.n_batches)
        self.hand.step(wait=True)


def pattern_hand_run(key: str, size: Dict[str, Any], budget_s: float) -> Dict[str, Any]:
    """The pattern's hand-written loop as a row of its own (not paired): its counts are the hand loop column."""
    rec = Recorder(True, size["warmup"], size["steps"], budget_s)
    hand = patterns.HandLoop(key, size["steps"])
    while True:
        rec.note_pending()
        hand.step()
        if rec.step_end():
            break
    out = rec.summary()
    out["last_loss"] = hand.shown
    out["checks"] = {"bf16_in_step_graph": hand.bf16_in_step_graph} if key == "bf16" else {}
    return out


def pattern_lightning_run(key: str, size: Dict[str, Any], budget_s: float,
                          partner: Optional[PairedReference] = None) -> Dict[str, Any]:
    """The pattern with the Lightning on ``sys.path`` (the fork or 2.6.6), counted per training step (per batch
    with accumulation, per validation batch for the validation pattern)."""
    import pytorch_lightning as pl

    validate = patterns.get(key).phase == "validate"
    rec = Recorder(True, size["warmup"], size["steps"], budget_s, partner)
    checks: Dict[str, Any] = {}

    def probe(loss: torch.Tensor) -> None:
        checks["bf16_in_step_graph"] = patterns.hlo_has_bf16(loss)

    def start() -> None:
        rec.note_pending()
        if validate and rec.partner is not None and len(rec.marks) % PAIR_BLOCK == 0:
            # an evaluation batch reads nothing: what the row queued on the device belongs to the row's time, not to
            # the paired block's
            rec._sync()
        rec.pair()

    info = patterns.run_lightning(pl, key, size["steps"], start, rec.step_end, probe=probe if key == "bf16" else None)
    out = rec.summary()
    out.update(info)
    out["checks"] = checks
    return out


def measure_pattern(key: str, column: str, size: Dict[str, Any], budget_s: float) -> Dict[str, Any]:
    """One cell group of the pattern table: ``column`` is ``hand`` (the hand-written loop) or a Lightning (whichever
    is on ``sys.path``), paired with the pattern's hand loop when it can be."""
    if column == "hand":
        return {"measure": pattern_hand_run(key, size, budget_s), "ratio_same_process": None}
    measure = pattern_lightning_run(key, size, budget_s, PatternReference(key, size["steps"]))
    paired = measure["paired"]
    if paired is not None:
        return {"measure": measure, "ratio_same_process": paired["ratio"],
                "reference": {"how": f"paired: {PAIR_BLOCK} steps of the pattern's hand loop after every "
                                     f"{PAIR_BLOCK} steps of the row", "s_per_step": paired["reference_s_per_step"]}}
    if not measure.get("unpaired_why"):
        measure["unpaired_why"] = (f"not paired: it stopped after {measure['steps_done']} steps, before a whole "
                                   f"block of {PAIR_BLOCK} paired steps fell in its steady state")
    refs = [pattern_hand_run(key, size, budget_s) for _ in range(2)]
    ref = sum(x["s_per_step"] for x in refs) / 2
    return {"measure": measure, "ratio_same_process": measure["s_per_step"] / ref if ref > 0 else None,
            "reference": {"how": "mean of two runs of the pattern's hand loop right after the row", "s_per_step": ref,
                          "runs": refs}}


# --------------------------------------------------------------------------------------------- entry point
ROW_KINDS: Dict[str, Callable[[Dict[str, Any], float, Optional[PairedReference]], Dict[str, Any]]] = {
    "xla-loop": lambda size, b, p: hand_loop(size, "xla", b, read_loss=True, partner=p),
    "xla-loop-noread": lambda size, b, p: hand_loop(size, "xla", b, read_loss=False, partner=p),
    "cpu-loop": lambda size, b, p: hand_loop(size, "cpu", b, read_loss=True, partner=p),
    "trainer-xla": lambda size, b, p: trainer_row(size, "tpu", b, partner=p),
    "trainer-cpu": lambda size, b, p: trainer_row(size, "cpu", b, partner=p),
    "lite-xla": lite_row,
}
#: the loop that never reads the loss leaves its step running on the device at the step boundary, where a paired
#: step would wait for it: it keeps the reference measured before and after it instead
UNPAIRED_KINDS = ("xla-loop-noread",)


def versions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {"python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import torch_xla

        out["torch_xla"] = torch_xla.__version__
    except Exception:
        out["torch_xla"] = None
    return out


LOSS_RTOL = 1e-3


def loss_check(measure: Dict[str, Any], reference: Dict[str, Any]) -> Dict[str, Any]:
    """Same init, data, optimizer and math: a row that ran all its steps must end at the reference's loss.

    This catches a row that is fast because it does not train (e.g. an optimizer left holding the CPU copies of
    parameters that were moved to the XLA device).
    """
    got, want = measure.get("last_loss"), reference.get("last_loss")
    out: Dict[str, Any] = {"last_loss": got, "reference_last_loss": want, "rtol": LOSS_RTOL}
    if measure["steps_done"] != measure["steps_planned"]:
        out["ok"] = None
        out["why"] = "not compared: the row stopped early"
    elif got is None or want is None:
        out["ok"] = None
        out["why"] = "not compared: no loss value"
    else:
        out["ok"] = abs(got - want) <= LOSS_RTOL * max(abs(want), 1e-12)
        if not out["ok"]:
            out["why"] = (f"the last loss is {got:.6f} but the hand-written loop ends at {want:.6f} on the same model, "
                          "data and optimizer: this row does not train the same way")
    return out


def measure_row(kind: str, size: Dict[str, Any], budget_s: float) -> Dict[str, Any]:
    """The row's measure, paired with the hand-written XLA loop when it can be, and its reference."""
    if kind in UNPAIRED_KINDS:
        before = hand_loop(size, "xla", budget_s, read_loss=True)
        measure = ROW_KINDS[kind](size, budget_s, None)
        measure["unpaired_why"] = ("not paired: it never reads the loss, so its step is still running on the device "
                                   "at the step boundary, where a paired step would wait for it")
        refs = [before, hand_loop(size, "xla", budget_s, read_loss=True)]
        how = "mean of the hand loop run right before and right after the row"
    else:
        measure = ROW_KINDS[kind](size, budget_s, PairedReference(size))
        paired = measure["paired"]
        if paired is not None:
            return {"measure": measure, "ratio_same_process": paired["ratio"],
                    "reference": {"how": f"paired: {PAIR_BLOCK} hand-loop steps after every {PAIR_BLOCK} steps of "
                                         "the row", "s_per_step": paired["reference_s_per_step"]}}
        if not measure.get("unpaired_why"):
            measure["unpaired_why"] = (f"not paired: it stopped after {measure['steps_done']} steps, before a whole "
                                       f"block of {PAIR_BLOCK} paired steps fell in its steady state")
        refs = [hand_loop(size, "xla", budget_s, read_loss=True) for _ in range(2)]
        how = "mean of two runs of the hand loop right after the row"
    ref = sum(x["s_per_step"] for x in refs) / 2
    return {"measure": measure, "ratio_same_process": measure["s_per_step"] / ref if ref > 0 else None,
            "reference": {"how": how, "s_per_step": ref, "runs": refs}}


def run(spec: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Run the rows of ``spec`` for each model size; a failure of one row or size does not stop the others.

    Each row is paired with the hand-written PT/XLA loop (see :class:`PairedReference`); a row that cannot be
    paired is compared with hand-loop runs made around it. The loss check against the hand loop is made by the
    driver. Only rows that import the same Lightning tree (or none) may share a process.
    """
    if spec.get("cpu_threads"):
        torch.set_num_threads(int(spec["cpu_threads"]))
    notes: List[str] = []
    vers = versions()
    vers["torch_threads"] = torch.get_num_threads()
    if any(r.get("pl266_override") for r in spec["rows"]):
        note = pl266_device_override()
        if note:
            notes.append(note)
            print(f"[bench] {note}", file=sys.stderr, flush=True)
    if any(r["kind"].startswith(("trainer", "lite")) or (r["kind"] == "pattern" and r.get("column") != "hand")
           for r in spec["rows"]):
        import pytorch_lightning as pl

        vers["lightning"] = pl.__version__
        vers["lightning_path"] = os.path.dirname(pl.__file__)
    results = [{"row": r["row"], "kind": r["kind"], "versions": vers, "notes": list(notes), "sizes": {}}
               for r in spec["rows"]]
    for name in spec["sizes"]:
        size = dict(SIZES[name], **spec.get("overrides", {}).get(name, {}))
        for r, result in zip(spec["rows"], results):
            entry: Dict[str, Any] = {"config": size}
            result["sizes"][name] = entry
            print(f"[bench] {r['row']} / {name}", file=sys.stderr, flush=True)
            try:
                if r["kind"] == "pattern":
                    entry.update(measure_pattern(r["pattern"], r["column"], size, spec["budget_s"]))
                else:
                    entry.update(measure_row(r["kind"], size, spec["budget_s"]))
            except Exception as err:  # noqa: BLE001 - reported to the driver, which fails loudly
                entry.pop("measure", None)
                entry["error"] = f"{type(err).__name__}: {err}"
                entry["traceback"] = traceback.format_exc()
                print(entry["traceback"], file=sys.stderr, flush=True)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", required=True,
                        help="JSON file: rows [{row, kind, pl266_override}], sizes, budget_s, overrides, cpu_threads")
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    results = run(spec)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    return 1 if any("error" in e for r in results for e in r["sizes"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
