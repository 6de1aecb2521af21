"""Count the times the training thread waits for the XLA device: its host reads, its host-to-device copies, and its
waits on the threads that read and copy for it.

A host read of an XLA tensor (``.item()``, ``.cpu()``, ``bool(t)``, ``torch_xla._XLAC._xla_get_cpu_tensors``, ...)
waits for every graph in flight on the device, not only the one that produced the value, and a host-to-device copy on
the training thread waits for the step in flight as well (on XLA:CPU with one compute thread, reading step N-1's loss
right after dispatching step N waited 15.7 ms of a 21 ms step): while the training thread waits, the host prepares
nothing and the device runs dry once it is done. Reads and copies made on other threads (Lightning's copying thread, a device loader's
threads) do not stop the training thread.

``TrainingThreadWaits`` counts, on the thread that created it and only there:

- **reads**: a torch function called with an XLA tensor that returns a CPU tensor or a Python value read from the
  device (``item``, ``tolist``, ``__bool__``, ...), and every call of ``torch_xla._XLAC._xla_get_cpu_tensors``;
- **copies**: a torch function called with a CPU tensor that returns an XLA tensor (``batch.to(device)``,
  ``xla * torch.tensor(2.0)``), and every call of ``torch_xla._XLAC._xla_tensors_from_aten`` (``xm.send_cpu_data_to_
  device``) on that thread;
- **waits**: a wait on another thread that blocks: ``threading.Event.wait`` on an event that is not set,
  ``threading.Condition.wait``, ``queue.Queue.get`` and ``queue.SimpleQueue.get`` on an empty queue,
  ``threading.Thread.join`` of a thread that is alive (each with a timeout that is not 0). Lightning's copying thread
  and its loader threads make reads and copies for the training thread; waiting for one of them is waiting for the
  device as much as reading is. A call that returns at once (the event is set, the queue holds an item) is not a
  wait. A wait made inside another (``Event.wait`` waits on a ``Condition``, ``Queue.get`` too) counts once, and a
  wait of the measurement itself (``snapshot``, inside ``paused()``) not at all. ``on_block``, when set, is called
  on the training thread with the kind of wait and the object waited on, just before the call blocks: a test can
  release what the thread waits for there, so that the count of a run does not depend on timing.

The torch functions are seen through a ``TorchFunctionMode``, which is thread-local. The direct calls of the two
``torch_xla._XLAC`` entry points are seen through wrappers that look at the calling thread; those made on other
threads are counted apart (``reads_elsewhere``, ``copies_elsewhere``). The waits are seen through wrappers that
replace, while counting, the methods of the classes above (``Event``, ``Condition``, ``Queue`` and ``Thread`` are
Python classes: every instance, whenever made, goes through the wrapper). ``queue.SimpleQueue`` is a C type whose
methods cannot be replaced: while counting, the name ``SimpleQueue`` in ``queue`` and in every module of
``pytorch_lightning`` and ``lightning_lite`` that imported it is bound to a subclass that counts, so every
``SimpleQueue`` that Lightning makes while counting is seen; one made before is not (Lightning's copying thread
makes its own, and only that thread takes from it). ``check_against_the_device_counters`` makes
the count answerable to torch_xla's own metrics: every device-to-host transfer the device counted in a window is
one of the reads counted here or a copy made elsewhere, so a read that escaped the count fails the check.
"""
import json
import os
import queue
import sys
import threading
import traceback
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytorch_lightning as pl
import torch

# torch functions that hand a value read from the device to Python
_READS_TO_PYTHON = {
    "item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__array__", "__repr__", "__str__",
    "__format__", "equal", "allclose",
}


def _tensors(value: Any, out: List[torch.Tensor], depth: int = 0) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif depth < 3 and isinstance(value, (list, tuple)):
        for item in value:
            _tensors(item, out, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for item in value.values():
            _tensors(item, out, depth + 1)
    return out


def _in_harness_transport() -> bool:
    import sys

    harness = sys.modules.get("helpers.gloo_xla_collectives")
    return harness is not None and harness.in_transport()


def _name(func: Any) -> str:
    return getattr(func, "__name__", "") or str(func)


class TrainingThreadWaits:
    """See the module's docstring. Use ``with waits.counting():`` around what is measured, on the training thread."""

    def __init__(self) -> None:
        self.thread = threading.current_thread()
        self.reads = 0
        self.copies = 0
        self.waits = 0
        self.reads_elsewhere = 0
        self.copies_elsewhere = 0
        self.where: List[str] = []  # what each wait on the training thread was, in order
        # called on the training thread with (kind, object) just before a wait blocks (see the module's docstring)
        self.on_block: Optional[Callable[[str, Any], None]] = None
        self._lock = threading.Lock()
        self._paused = 0
        self._in_wait = False  # inside a counted wait: the waits it makes itself are its own
        # the other threads inside a wait that blocks, by thread ident (nested waits count each): idle threads
        self._blocked: Dict[int, int] = {}

    # ------------------------------------------------------------------------------------------ the counting
    def _note(self, kind: str, what: str) -> None:
        if kind == "read":
            self.reads += 1
        elif kind == "copy":
            self.copies += 1
        else:
            self.waits += 1
        # where in Lightning (or the test) it came from: the innermost frames outside torch, threading, queue and
        # this module
        frames = [f for f in traceback.extract_stack()[:-2] if "torch" not in f.filename.split(os.sep)[-3:-1]
                  and not f.filename.endswith(("xla_waits.py", os.sep + "threading.py", os.sep + "queue.py"))]
        self.where.append(f"{kind}: {what} at " + " < ".join(f"{os.path.basename(f.filename)}:{f.lineno}"
                                                          for f in reversed(frames[-3:])))

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing the training thread does inside is counted: for the measurement's own waits."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def _waiting(self, kind: str, obj: Any, blocks: Callable[[], bool], call: Callable[[], Any]) -> Any:
        """Make the wait ``call``, and count it if it is the training thread's and ``blocks()`` says it will block."""
        if threading.current_thread() is not self.thread:
            if not blocks():
                return call()
            ident = threading.get_ident()
            with self._lock:
                self._blocked[ident] = self._blocked.get(ident, 0) + 1
            try:
                return call()
            finally:
                with self._lock:
                    self._blocked[ident] -= 1
        if self._in_wait or self._paused or _in_harness_transport() or not blocks():
            return call()
        self._note("wait", kind)
        if self.on_block is not None:
            self.on_block(kind, obj)
        self._in_wait = True
        try:
            return call()
        finally:
            self._in_wait = False

    @contextmanager
    def _counting_waits(self) -> Iterator[None]:
        """Replace the waits of ``threading`` and ``queue`` with counting ones (see the module's docstring)."""
        waits = self
        real_event_wait, real_condition_wait = threading.Event.wait, threading.Condition.wait
        real_queue_get, real_join = queue.Queue.get, threading.Thread.join
        real_simple_queue = queue.SimpleQueue

        def may_block(timeout: Optional[float]) -> bool:
            return timeout is None or timeout > 0

        def event_wait(self: threading.Event, timeout: Optional[float] = None) -> bool:
            return waits._waiting("Event.wait", self, lambda: may_block(timeout) and not self.is_set(),
                                  lambda: real_event_wait(self, timeout))

        def condition_wait(self: threading.Condition, timeout: Optional[float] = None) -> bool:
            return waits._waiting("Condition.wait", self, lambda: may_block(timeout),
                                  lambda: real_condition_wait(self, timeout))

        def queue_get(self: queue.Queue, block: bool = True, timeout: Optional[float] = None) -> Any:
            return waits._waiting("Queue.get", self, lambda: block and may_block(timeout) and self.empty(),
                                  lambda: real_queue_get(self, block, timeout))

        def join(self: threading.Thread, timeout: Optional[float] = None) -> None:
            return waits._waiting("Thread.join", self, lambda: may_block(timeout) and self.is_alive(),
                                  lambda: real_join(self, timeout))

        class SimpleQueue(real_simple_queue):  # type: ignore[misc,valid-type]
            def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
                return waits._waiting("SimpleQueue.get", self, lambda: block and may_block(timeout) and self.empty(),
                                      lambda: super(SimpleQueue, self).get(block, timeout))

        # the modules that took the name `SimpleQueue` from `queue`: Lightning's, and `queue` itself
        rebound = [queue] + [module for name, module in list(sys.modules.items())
                             if name.split(".")[0] in ("pytorch_lightning", "lightning_lite") and module is not None
                             and getattr(module, "SimpleQueue", None) is real_simple_queue]
        threading.Event.wait, threading.Condition.wait = event_wait, condition_wait  # type: ignore[assignment]
        queue.Queue.get, threading.Thread.join = queue_get, join  # type: ignore[assignment]
        for module in rebound:
            module.SimpleQueue = SimpleQueue  # type: ignore[attr-defined]
        try:
            yield
        finally:
            threading.Event.wait, threading.Condition.wait = real_event_wait, real_condition_wait  # type: ignore
            queue.Queue.get, threading.Thread.join = real_queue_get, real_join  # type: ignore[assignment]
            for module in rebound:
                module.SimpleQueue = real_simple_queue  # type: ignore[attr-defined]

    def _torch_function(self, func: Any, args: tuple, kwargs: dict, result: Any) -> None:
        if _in_harness_transport():
            return  # the multi-process harness carries a collective through the host, where a TPU keeps it on chip
        inputs = _tensors(args, []) + _tensors(kwargs, [])
        if not inputs:
            return
        devices = {t.device.type for t in inputs}
        outputs = _tensors(result, [])
        name = _name(func)
        if "xla" in devices and (name in _READS_TO_PYTHON or any(t.device.type == "cpu" for t in outputs)):
            self._note("read", name)
        elif "cpu" in devices and any(t.device.type == "xla" for t in outputs):
            self._note("copy", name)

    @contextmanager
    def counting(self) -> Iterator["TrainingThreadWaits"]:
        import torch_xla
        from torch.overrides import TorchFunctionMode

        waits = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
                kwargs = kwargs or {}
                result = func(*args, **kwargs)
                waits._torch_function(func, args, kwargs, result)
                return result

        xlac = torch_xla._XLAC
        get_cpu_tensors, tensors_from_aten = xlac._xla_get_cpu_tensors, xlac._xla_tensors_from_aten

        def spy(kind: str, real: Any) -> Any:
            elsewhere = {"read": "reads_elsewhere", "copy": "copies_elsewhere"}[kind]

            def call(tensors: Any, *args: Any, **kwargs: Any) -> Any:
                if tensors and not _in_harness_transport():
                    if threading.current_thread() is waits.thread:
                        waits._note(kind, real.__name__)
                    else:
                        with waits._lock:
                            setattr(waits, elsewhere, getattr(waits, elsewhere) + 1)
                return real(tensors, *args, **kwargs)

            return call

        _get_cpu_tensors, _tensors_from_aten = spy("read", get_cpu_tensors), spy("copy", tensors_from_aten)
        xlac._xla_get_cpu_tensors, xlac._xla_tensors_from_aten = _get_cpu_tensors, _tensors_from_aten
        mode = _Mode()
        mode.__enter__()
        try:
            with self._counting_waits():
                yield self
        finally:
            mode.__exit__(None, None, None)
            xlac._xla_get_cpu_tensors, xlac._xla_tensors_from_aten = get_cpu_tensors, tensors_from_aten

    # ------------------------------------------------------------------------------------------ per step
    def _settle_loader_threads(self, timeout: float = 2.0) -> None:
        """Give the loader threads that copy host-loaded batches (``num_workers=0``) the time to copy every batch
        handed to them so far: until each waits for more, at most ``timeout`` seconds.

        On a host whose cores are all busy (two pytest workers on two cores) such a thread can go unscheduled for
        longer than a small model's step, and the training thread then waits for a batch that was handed over steps
        before: a wait for the host's scheduler, not for the device. Settled here, a wait that remains is one the
        design makes: a batch handed over too late, or a copy that needs the step about to run."""
        import time

        from lightning_lite.utilities import xla_threads
        from lightning_lite.utilities.xla_batches import _Prefetch

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with xla_threads._lock:
                passes = [w for w in xla_threads._work if isinstance(w, _Prefetch) and w._load_here
                          and w._thread.is_alive()]
            with self._lock:
                if all(w._loaded.empty() and self._blocked.get(w._thread.ident or 0, 0) for w in passes):
                    return
            time.sleep(0.001)

    def snapshot(self) -> Dict[str, int]:
        """The counts so far, and the device's transfer counters once the copies in flight are made.

        Waiting for Lightning's copying thread here (``XLACounters.get``) is the measurement's, not the training's
        (it is not counted): it makes the device counters comparable with the counts. It also means that the copies
        of the earlier steps are made when the next step's barrier comes: the training thread's waits for copies that
        are not made yet are shown with the copies held (``tests_pytorch/trainer/test_xla_copies_in_flight.py``).
        Before that it lets the loader threads copy the batches handed to them (:meth:`_settle_loader_threads`), also
        uncounted. Call it inside :meth:`counting`: only there does it see which threads wait for more.
        """
        from helpers.xla_metrics import XLACounters

        with self.paused():
            self._settle_loader_threads()
            transfers_from = XLACounters.get("TransferFromDeviceTime")
        with self._lock:
            return {
                "reads": self.reads, "copies": self.copies, "waits": self.waits,
                "reads_elsewhere": self.reads_elsewhere, "copies_elsewhere": self.copies_elsewhere, "transfers_from_device": transfers_from,
                "transfers_to_device": XLACounters.value("TransferToDeviceTime"),
                "compiles": XLACounters.value("CompileTime"),
                # an SPMD step runs as one replicated execution
                "executions": XLACounters.value("ExecuteTime") + XLACounters.value("ExecuteReplicatedTime"),
                "where": len(self.where),
            }

    def between(self, start: Dict[str, int], end: Dict[str, int]) -> Dict[str, Any]:
        delta: Dict[str, Any] = {k: end[k] - start[k] for k in start}
        delta["what"] = self.where[start["where"]:end["where"]]
        return delta


def waits_of(row: Dict[str, Any]) -> int:
    """All the times the training thread waited in the window ``row``: its reads, its copies, its waits on threads."""
    return row["reads"] + row["copies"] + row["waits"]


def check_against_the_device_counters(delta: Dict[str, Any]) -> None:
    """Every device-to-host transfer that torch_xla counted in the window is a read counted on the training thread
    or a copy made on another thread."""
    seen = delta["reads"] + delta["reads_elsewhere"]
    assert delta["transfers_from_device"] == seen, (
        f"torch_xla counted {delta['transfers_from_device']} device-to-host transfers, the count saw {seen}: a read"
        f" escaped it ({delta})"
    )


# ---------------------------------------------------------------------------------------------- the patterns
#: the ways users train that the training thread must not wait in (``pattern_run``)
PATTERNS = (
    "automatic", "accumulate", "manual_two_optimizers", "automatic_two_optimizers", "sync_dist", "torchmetrics",
    "bf16", "clipping",
)
BATCH, FEATURES, CLASSES = 8, 16, 4


class PatternModule(pl.LightningModule):
    """A small classifier that trains and logs as its ``pattern`` says; its loss is on the progress bar every step."""

    def __init__(self, pattern: str) -> None:
        super().__init__()
        import torchmetrics

        self.pattern = pattern
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES))
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)

    def loss(self, batch: Any) -> torch.Tensor:
        x, y = batch
        logits = self.net(x)
        if self.pattern == "torchmetrics":
            self.accuracy(logits, y)
            self.log("train_acc", self.accuracy, on_step=True, on_epoch=True, prog_bar=True)
        return torch.nn.functional.cross_entropy(logits.float(), y)

    def training_step(self, batch: Any, batch_idx: int, optimizer_idx: int = 0) -> Any:
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=True, sync_dist=self.pattern == "sync_dist")
        return loss

    def configure_optimizers(self) -> Any:
        sgd = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        if self.pattern in ("manual_two_optimizers", "automatic_two_optimizers"):
            return [sgd, torch.optim.Adam(self.parameters(), lr=1e-3)]
        return sgd


class ManualPatternModule(PatternModule):
    """Manual optimization with two optimizers, each stepped in every ``training_step``."""

    def __init__(self, pattern: str = "manual_two_optimizers") -> None:
        super().__init__(pattern)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:  # type: ignore[override]
        for opt in self.optimizers():
            opt.zero_grad()
            loss = self.loss(batch)
            self.manual_backward(loss)
            opt.step()
        self.log("train_loss", loss, prog_bar=True)


def pattern_module(pattern: str) -> PatternModule:
    return ManualPatternModule() if pattern == "manual_two_optimizers" else PatternModule(pattern)


def pattern_trainer_kwargs(pattern: str) -> Dict[str, Any]:
    return {
        "accumulate": {"accumulate_grad_batches": 2},
        "bf16": {"precision": "bf16"},
        "clipping": {"gradient_clip_val": 0.5},
    }.get(pattern, {})


def pattern_loader(batches: int) -> Any:
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    n = batches * BATCH
    data = TensorDataset(torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g))
    return DataLoader(data, batch_size=BATCH)


@contextmanager
def _graph_report_off() -> Iterator[None]:
    """The XLA graph report off: when a sampled step looks costly it traces the next step, and has that step's copy
    made on the training thread, where the trace can see it (docs/graph-report.md). A diagnostic, not the step."""
    saved = os.environ.get("PL_XLA_GRAPH_REPORT")
    os.environ["PL_XLA_GRAPH_REPORT"] = "off"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["PL_XLA_GRAPH_REPORT"]
        else:
            os.environ["PL_XLA_GRAPH_REPORT"] = saved


class WaitsProbe(pl.Callback):
    """Counts the training thread's waits from ``on_train_start`` to ``on_train_end``, with a snapshot at the start of
    every training batch (``steady_steps``). With ``out_dir``, each process writes its steady steps to
    ``<out_dir>/waits-rank<N>.json`` when training ends (several processes, ``tpu_spawn``)."""

    def __init__(self, warmup: int = 4, out_dir: Optional[str] = None) -> None:
        self.warmup = warmup
        self.out_dir = out_dir
        self.waits: Optional[TrainingThreadWaits] = None
        self.marks: List[Dict[str, int]] = []
        self._counting: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.waits = TrainingThreadWaits()
        self._counting = self.waits.counting()
        self._counting.__enter__()

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        assert self.waits is not None
        self.marks.append(self.waits.snapshot())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        assert self.waits is not None
        self.marks.append(self.waits.snapshot())
        self._counting.__exit__(None, None, None)
        if self.out_dir is not None:
            path = os.path.join(self.out_dir, f"waits-rank{trainer.global_rank}.json")
            with open(path, "w") as f:
                json.dump(self.steady_steps(), f)

    def steady_steps(self) -> List[Dict[str, Any]]:
        """One row per batch after the warm-up, up to the last batch (whose window would hold the epoch's end)."""
        assert self.waits is not None
        marks = self.marks[:-1]
        return [self.waits.between(a, b) for a, b in zip(marks[self.warmup:], marks[self.warmup + 1:])]


def pattern_run(pattern: str, root: Any, batches: int = 12, warmup: int = 4, **trainer_kwargs: Any
                ) -> List[Dict[str, Any]]:
    """Fit ``pattern`` with the progress bar and a CSV logger that logs every step, and count what each steady batch
    cost the training thread and the device (one row per batch after ``warmup``). On one XLA device unless
    ``trainer_kwargs`` say otherwise."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.loggers import CSVLogger

    probe = WaitsProbe(warmup)
    kwargs = dict(
        accelerator="tpu", devices=1, max_epochs=1, default_root_dir=root, logger=CSVLogger(root),
        log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False, callbacks=[probe],
    )
    kwargs.update(pattern_trainer_kwargs(pattern))
    kwargs.update(trainer_kwargs)
    with _graph_report_off():
        trainer = Trainer(**kwargs)
        trainer.fit(pattern_module(pattern), pattern_loader(batches))
    assert trainer.progress_bar_callback is not None and len(probe.marks) == batches + 1
    return probe.steady_steps()


def check_a_steady_step_never_waits(rows: List[Dict[str, Any]], executions: int = 1) -> None:
    """No read, no copy and no wait on another thread on the training thread in any of the steady steps ``rows``,
    every read checked against the device's counter; and the step still costs what it cost: nothing compiled,
    ``executions`` graph(s), at most one device-to-host transfer (made elsewhere)."""
    assert len(rows) >= 4, rows
    for row in rows:
        check_against_the_device_counters(row)
    assert [waits_of(row) for row in rows] == [0] * len(rows), [row["what"] for row in rows]
    assert {(row["compiles"], row["executions"]) for row in rows} == {(0, executions)}, rows
    assert all(row["transfers_from_device"] <= 1 for row in rows), rows


def evaluation_run(root: Any, batches: int = 10, warmup: int = 3) -> Dict[str, List[Dict[str, Any]]]:
    """``trainer.validate``, ``trainer.test`` and ``trainer.predict`` of the automatic pattern on one XLA device, the
    progress bar on and a CSV logger: what each steady batch of each stage cost the training thread."""
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.loggers import CSVLogger

    module = pattern_module("automatic")

    def evaluation_step(batch: Any, batch_idx: int) -> None:
        module.log("eval_loss", module.loss(batch), prog_bar=True)

    module.validation_step = evaluation_step
    module.test_step = evaluation_step
    module.predict_step = lambda batch, batch_idx, dataloader_idx=0: module.net(batch[0]).softmax(-1)
    waits = TrainingThreadWaits()
    marks: Dict[str, List[Dict[str, int]]] = {"validate": [], "test": [], "predict": []}

    class Probe(Callback):
        def on_validation_batch_start(self, *args: Any) -> None:
            marks["validate"].append(waits.snapshot())

        def on_test_batch_start(self, *args: Any) -> None:
            marks["test"].append(waits.snapshot())

        def on_predict_batch_start(self, *args: Any) -> None:
            marks["predict"].append(waits.snapshot())

    with _graph_report_off():
        trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=root, logger=CSVLogger(root),
                          enable_model_summary=False, callbacks=[Probe()])
    with waits.counting():
        trainer.validate(module, pattern_loader(batches))
        trainer.test(module, pattern_loader(batches))
        predictions = trainer.predict(module, pattern_loader(batches))
    assert len(predictions) == batches and all(p.device.type == "cpu" and p.shape == (BATCH, CLASSES)
                                               for p in predictions)
    return {stage: [waits.between(a, b) for a, b in zip(m[warmup:], m[warmup + 1:])] for stage, m in marks.items()}


class RecordingLogger(pl.loggers.logger.Logger):
    """A logger that keeps, for every ``log_metrics`` call in order, the step and the names of the metrics (and the
    values, in ``values``)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: List[Any] = []
        self.values: List[Dict[str, float]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: Dict[str, float], step: Optional[int] = None) -> None:
        self.calls.append((step, tuple(sorted(metrics))))
        self.values.append(dict(metrics))
