"""Where the host's CPU time of a steady training step goes: the fork's Trainer, its Lite, Lightning 2.6.6's Trainer.

``bench/host_bench.py`` says how long a step takes on the host; this says where that time is spent. Each row runs the
small MLP of ``host_bench.py`` (its layers and batch size, the loss on the progress bar for the Trainers,
``loss.item()`` every step for Lite) in a process of its own, with a few functions wrapped: data fetch and the move to
the device, the user's ``training_step``, autograd, ``zero_grad``, the optimizer's own step, the barrier, the
device-to-host copy, and for the Trainers hook dispatch, the plumbing around ``optimizer.step``, the precision
plugin's step, ``self.log``, the result collection, the progress bar and the fork's own pieces.
A wrapped function's time is counted *exclusive* of the wrapped functions it calls, so the sections add up to the
step; what no section covers is "rest". Each figure is a mean over the steady steps of a run, then the median over
runs (the rows take turns, run by run).

The wrappers cost time themselves: about two microseconds a call, measured in each worker and reported ("timer").
A wrapper's cost lands in the section that called it, so small sections read high. The figures are for finding
where the time goes, not for comparing trees: ``host_bench.py`` does that, in lock-step. No test asserts these times.

    python -m bench.host_profile [--runs 3] [--steps 700] [--md results/host-profile.md]
"""
import argparse
import functools
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# the model and its batch are those of the lock-stepped benchmark
from .host_bench import BATCH, LAYERS
from .report import stamp, write_json, write_markdown_page
from .trees import ROOT, default_pjrt_device, install_pl266, module_command, row_env

ROWS = ("fork", "lite", "pl266")
LABELS = {"fork": "fork Trainer", "lite": "fork Lite", "pl266": "Lightning 2.6.6 Trainer"}

# (section, rows, candidates): each candidate is "module:Class.method" (or "module:function"); every candidate found
# is wrapped, one that is missing is skipped (1.8 and 2.6.6 name things differently). A row that finds none of the
# candidates of one of its sections fails: the profile would silently lose that section otherwise.
PL = "pytorch_lightning"
TRAINERS = ("fork", "pl266")
SECTIONS: List[Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = [
    ("data fetch", TRAINERS, (f"{PL}.utilities.fetching:AbstractDataFetcher.__next__",
                              f"{PL}.loops.fetchers:_DataFetcher.__next__",
                              f"{PL}.loops.fetchers:_PrefetchDataFetcher.__next__")),
    ("autograd backward", ROWS, ("torch:Tensor.backward",)),
    ("optimizer.zero_grad (torch)", ROWS, ("torch.optim:Optimizer.zero_grad",)),
    ("optimizer's own step (torch)", ROWS, ("torch.optim:SGD.step",)),
    ("barrier (mark_step)", ROWS, ("torch_xla:_XLAC._xla_step_marker",)),
    ("device-to-host copy", ("fork",), ("torch_xla:_XLAC._xla_get_cpu_tensors",)),
    ("hook dispatch, with the bodies of untimed hooks", TRAINERS, (
        f"{PL}.trainer.trainer:Trainer._call_callback_hooks", f"{PL}.trainer.trainer:Trainer._call_lightning_module_hook",
        f"{PL}.trainer.trainer:Trainer._call_strategy_hook", f"{PL}.trainer.call:_call_callback_hooks",
        f"{PL}.trainer.call:_call_lightning_module_hook", f"{PL}.trainer.call:_call_strategy_hook")),
    ("plumbing of optimizer.step (LightningOptimizer, strategy, closure, clipping)", TRAINERS, (
        f"{PL}.core.optimizer:LightningOptimizer.step", f"{PL}.strategies.strategy:Strategy.optimizer_step",
        f"{PL}.strategies.strategy:Strategy.training_step", f"{PL}.strategies.strategy:Strategy.backward",
        f"{PL}.plugins.precision.tpu:TPUPrecisionPlugin.backward",
        f"{PL}.loops.optimization.optimizer_loop:Closure.__call__",
        f"{PL}.loops.optimization.optimizer_loop:Closure.closure",
        f"{PL}.loops.optimization.automatic:Closure.__call__", f"{PL}.loops.optimization.automatic:Closure.closure",
        f"{PL}.core.module:LightningModule.optimizer_step", f"{PL}.core.module:LightningModule.clip_gradients")),
    # torch wraps the optimizer's step (hooks, a profiler record) and ``torch_xla.sync()`` runs Python around the
    # barrier: both run here, untimed, and in Lite's loop too, where they fall in "rest"
    ("precision plugin's optimizer_step, with torch's step wrapper and torch_xla.sync()", TRAINERS, (
        f"{PL}.plugins.precision.tpu:TPUPrecisionPlugin.optimizer_step",
        f"{PL}.plugins.precision.xla:XLAPrecision.optimizer_step")),
    ("self.log (LightningModule.log)", TRAINERS, (f"{PL}.core.module:LightningModule.log",)),
    ("self.log (result collection)", TRAINERS,
     (f"{PL}.trainer.connectors.logger_connector.result:_ResultCollection.log",)),
    ("result collection metrics()", TRAINERS,
     (f"{PL}.trainer.connectors.logger_connector.result:_ResultCollection.metrics",)),
    ("logger connector", TRAINERS, (
        f"{PL}.trainer.connectors.logger_connector.logger_connector:LoggerConnector.on_batch_start",
        f"{PL}.trainer.connectors.logger_connector.logger_connector:LoggerConnector.on_batch_end",
        f"{PL}.trainer.connectors.logger_connector.logger_connector:LoggerConnector.update_train_step_metrics",
        f"{PL}.trainer.connectors.logger_connector.logger_connector:_LoggerConnector.on_batch_start",
        f"{PL}.trainer.connectors.logger_connector.logger_connector:_LoggerConnector.on_batch_end",
        f"{PL}.trainer.connectors.logger_connector.logger_connector:_LoggerConnector.update_train_step_metrics")),
    ("progress bar", TRAINERS, (f"{PL}.callbacks.progress.tqdm_progress:TQDMProgressBar.on_train_batch_end",)),
    ("checkpoint callback", TRAINERS, (f"{PL}.callbacks.model_checkpoint:ModelCheckpoint.on_train_batch_end",)),
    ("batch to device", TRAINERS, (f"{PL}.strategies.strategy:Strategy.batch_to_device",
                                   f"{PL}.core.hooks:DataHooks.transfer_batch_to_device")),
    # Lite on one device: a loader thread copies the batches, the loop's thread takes the one that is ready
    ("batch to device", ("lite",), ("lightning_lite.utilities.xla_batches:_Prefetch._next_ready",)),
    ("running loss (1.8)", ("fork",),
     (f"{PL}.loops.batch.training_batch_loop:TrainingBatchLoop._update_running_loss",)),
    # the step's copy goes to the copying thread, and the previous step's values reach their consumers
    ("the fork's deferred transfer, with its consumers", ("fork",),
     (f"{PL}.utilities.xla_host_transfers:_XLAHostTransfers.start",)),
    ("the fork's XLA graph report", ("fork",), (f"{PL}.utilities.xla_graph_report:_XLAGraphReport.step_start",
                                                f"{PL}.utilities.xla_graph_report:_XLAGraphReport.step_end")),
]
# sections a row times by hand, around its own code (the module's training_step, Lite's loop body)
USER_STEP = "training_step (the user's forward and loss)"
LITE_FETCH = "data fetch"
LITE_COPY = "device-to-host copy"


class Sections:
    """Exclusive CPU time per section: a stack of the time that nested timed calls took.

    Only the calls of the thread that made it (the training thread) are timed: Lightning's loader and copying
    threads call some timed functions too, and their calls would land on this thread's stack and in its sections.
    """

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.on = False
        self.thread = threading.get_ident()
        self.seconds: Dict[str, float] = {}
        self.calls: Dict[str, int] = {}
        self._stack: List[float] = []

    def timed(self, label: str, fn: Callable) -> Callable:
        """``fn``, timed under ``label`` while :attr:`on`."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not self.on or threading.get_ident() != self.thread:
                return fn(*args, **kwargs)
            start = self.clock()
            self._stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                nested = self._stack.pop()
                took = self.clock() - start
                self.seconds[label] = self.seconds.get(label, 0.0) + took - nested
                self.calls[label] = self.calls.get(label, 0) + 1
                if self._stack:
                    self._stack[-1] += took

        return wrapper

    def wrap(self, owner: Any, name: str, label: str) -> None:
        setattr(owner, name, self.timed(label, getattr(owner, name)))


def resolve(candidate: str) -> Optional[Tuple[Any, str]]:
    """``(owner, attribute)`` of ``"module:Class.method"``, or None when the module or the name is not there. A method
    counts only where its class defines it: a subclass that inherits it would be wrapped twice otherwise."""
    module_name, path = candidate.split(":")
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError:
        return None
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if isinstance(owner, type):
        return (owner, name) if name in vars(owner) else None
    return (owner, name) if hasattr(owner, name) else None


def install(sections: Sections, row: str, specs: Sequence[Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = SECTIONS
            ) -> List[str]:
    """Wrap every section of ``row``; the names of the sections that found nothing to wrap."""
    missing = []
    for label, rows, candidates in specs:
        if row not in rows:
            continue
        found = [r for r in map(resolve, candidates) if r is not None]
        for owner, name in found:
            sections.wrap(owner, name, label)
        if not found:
            missing.append(label)
    return missing


def timer_cost(sections: Sections, calls: int = 20000) -> float:
    """Seconds one timed call costs, measured with a timed function that does nothing."""
    noop = sections.timed("calibration", lambda: None)
    was, sections.on = sections.on, True
    start = time.thread_time()
    for _ in range(calls):
        noop()
    cost = (time.thread_time() - start) / calls
    sections.on = was
    sections.seconds.pop("calibration", None)
    sections.calls.pop("calibration", None)
    return cost


# --------------------------------------------------------------------------------------------- worker side
class Steps:
    """Turns the timing on for steps ``first`` to ``last`` and records when each of them ended."""

    def __init__(self, sections: Sections, first: int, last: int) -> None:
        self.sections, self.first, self.last = sections, first, last
        self.ends: List[float] = []

    def end(self, index: int) -> None:
        if index == self.first:
            self.sections.on = True
        if self.first <= index <= self.last:
            self.ends.append(time.thread_time())
        if index == self.last:
            self.sections.on = False


def run_trainer(sections: Sections, steps: Steps, total: int, pl266: bool) -> None:
    from . import bench_rows as rows  # torch: the worker's process only

    if pl266:
        rows.pl266_device_override()
    import pytorch_lightning as pl

    Model = rows.make_module_class(pl)
    Model.training_step = sections.timed(USER_STEP, Model.training_step)

    class StepEnd(pl.Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            steps.end(batch_idx)

    with tempfile.TemporaryDirectory(prefix="host-profile-") as root:
        trainer = pl.Trainer(accelerator="tpu", devices=1, max_steps=total, max_epochs=1, logger=False,
                             default_root_dir=root, callbacks=[StepEnd()])
        trainer.fit(Model(LAYERS), rows.make_loader(LAYERS, BATCH, total))


def run_lite(sections: Sections, steps: Steps, total: int) -> None:
    from . import bench_rows as rows  # torch: the worker's process only

    import torch.nn.functional as F
    from lightning_lite import LightningLite

    def step_loss(net: Any, x: Any, y: Any) -> Any:
        return F.cross_entropy(net(x), y)

    forward_and_loss = sections.timed(USER_STEP, step_loss)
    fetch = sections.timed(LITE_FETCH, next)
    copy = sections.timed(LITE_COPY, lambda t: t.item())

    class Loop(LightningLite):
        def run(self) -> None:
            net = rows.make_net(LAYERS)
            opt = rows.make_optimizer(net.parameters())
            net, opt = self.setup(net, opt)
            batches = iter(self.setup_dataloaders(rows.make_loader(LAYERS, BATCH, total)))
            for i in range(total):
                x, y = fetch(batches)
                opt.zero_grad()
                loss = forward_and_loss(net, x, y)
                self.backward(loss)
                opt.step()
                copy(loss)
                steps.end(i)

    Loop(accelerator="tpu", devices=1).run()


def worker(row: str, total: int, first: int, out: str) -> int:
    sections = Sections()
    missing = install(sections, row)
    if missing:
        raise SystemExit(f"host_profile: the {row} row found nothing to time for: {', '.join(missing)}")
    cost = timer_cost(sections)
    steps = Steps(sections, first, total - 1)
    if row == "lite":
        run_lite(sections, steps, total)
    else:
        run_trainer(sections, steps, total, pl266=row == "pl266")
    n = len(steps.ends) - 1
    if n < 1:
        raise SystemExit(f"host_profile: the {row} row ran no steady step")
    calls = sum(sections.calls.values())
    result = {
        "row": row, "steps": n, "step_ms": (steps.ends[-1] - steps.ends[0]) / n * 1e3,
        "timer_ms": cost * calls / n * 1e3, "timer_us_per_call": cost * 1e6,
        "sections_ms": {k: v / n * 1e3 for k, v in sections.seconds.items()},
        "calls_per_step": {k: v / n for k, v in sections.calls.items()},
    }
    Path(out).write_text(json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------- driver side
def run_worker(row: str, pythonpath: Optional[str], total: int, first: int, python: str, log: Path) -> Dict[str, Any]:
    """Run ``row`` in a process of its own; its output and its result go beside each other (``log``, ``.json``)."""
    out = log.with_suffix(".json")
    cmd = module_command(python, "host_profile", "--worker", row, "--steps", str(total), "--first", str(first),
                         "--out", str(out))
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=row_env(Path(pythonpath) if pythonpath else None), cwd=str(ROOT), stdout=f,
                            stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"host_profile worker {row} failed (exit {rc}); see {log}")
    return json.loads(out.read_text())


def summarize(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, float]]:
    """Per row: the median over runs of each section, of ``rest`` (the step less its sections and the timer's own
    cost) and of the step."""
    table: Dict[str, Dict[str, float]] = {}
    for row, results in runs.items():
        labels = sorted({k for r in results for k in r["sections_ms"]})
        col = {k: statistics.median(r["sections_ms"].get(k, 0.0) for r in results) for k in labels}
        col["rest"] = statistics.median(r["step_ms"] - r["timer_ms"] - sum(r["sections_ms"].values()) for r in results)
        col["timer"] = statistics.median(r["timer_ms"] for r in results)
        col["step"] = statistics.median(r["step_ms"] for r in results)
        table[row] = col
    return table


def markdown(table: Dict[str, Dict[str, float]], runs: int, steps: int) -> str:
    rows = [r for r in ROWS if r in table]
    # the user's step comes right after the data fetch; a label listed twice (one spec per row) shows once
    order = [SECTIONS[0][0], USER_STEP] + [label for label, _, _ in SECTIONS[1:]]
    labels = [k for k in dict.fromkeys(order) if any(k in table[r] for r in rows)]
    lines = [
        "# Host CPU per step, by section",
        "",
        f"The small MLP (64-128-10, batch 32) on the XLA device; ms of the training thread's CPU time per steady "
        f"step, each section exclusive of the sections it calls; the mean over {steps} steps, median of {runs} runs "
        "per row. `timer` is the wrappers' own cost; `rest` is what no section covers (the loops, properties, "
        "untimed calls). `-`: the row has no such section.",
        "",
        "| section | " + " | ".join(LABELS[r] for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]

    def cell(row: str, key: str) -> str:
        return f"{table[row][key]:.3f}" if key in table[row] else "-"

    for key in labels + ["rest", "timer"]:
        lines.append(f"| {key} | " + " | ".join(cell(r, key) for r in rows) + " |")
    lines.append("| **step** | " + " | ".join(f"**{table[r]['step']:.3f}**" for r in rows) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=ROWS)
    p.add_argument("--steps", type=int, default=700, help="steps per run")
    p.add_argument("--first", type=int, default=100, help="the first steady step (the earlier ones warm up)")
    p.add_argument("--out", help="(worker) where to write its result")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--fork-path", default=None, help="PYTHONPATH of the fork (default: the fork in the venv)")
    p.add_argument("--pl266-path", default=None, help="PYTHONPATH of Lightning 2.6.6 (default: build/bench/pl266)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--json", default=str(ROOT / "results" / "host-profile.json"))
    p.add_argument("--md", default=str(ROOT / "results" / "host-profile.md"))
    args = p.parse_args(argv)
    if args.first < 1 or args.first >= args.steps - 1:
        p.error("--first must leave at least two steady steps before --steps")
    if args.worker:
        return worker(args.worker, args.steps, args.first, args.out)
    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        p.error(f"no row {', '.join(unknown)}: choose from {', '.join(ROWS)}")
    default_pjrt_device()
    stamped = stamp(tree=args.fork_path or "the fork installed in the venv")
    paths = {"fork": args.fork_path, "lite": args.fork_path, "pl266": args.pl266_path}
    if "pl266" in rows and paths["pl266"] is None:
        paths["pl266"] = str(install_pl266(args.python)[0])
    logs = ROOT / "build" / "bench" / "host-profile-logs"
    logs.mkdir(parents=True, exist_ok=True)
    runs: Dict[str, List[Dict[str, Any]]] = {r: [] for r in rows}
    for i in range(args.runs):
        for row in rows if i % 2 == 0 else rows[::-1]:
            res = run_worker(row, paths[row], args.steps, args.first, args.python, logs / f"r{i}-{row}.log")
            runs[row].append(res)
            print(f"[host-profile] run {i + 1}/{args.runs}: {row} {res['step_ms']:.3f} ms a step", flush=True)
    table = summarize(runs)
    write_json(Path(args.json), {"runs": runs, "table": table}, stamped)
    text = write_markdown_page(Path(args.md), markdown(table, args.runs, args.steps - args.first - 1), stamped)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
