"""Host CPU time per training step: the fork's Trainer, Lightning 2.6.6's Trainer, the fork's Lite, the hand loop.

On a TPU every step ends with one blocking read (the logged loss), so the host's Python per step bounds throughput
whenever the device step is short. This benchmark measures that Python: the CPU time of the training thread
(``time.thread_time()``) between the ends of two consecutive steady steps, on the small MLP of ``graph_bench.py``
(64-128-10, batch 32, loss on the progress bar for the Trainers, ``loss.item()`` every step for Lite and the hand loop).

The machine that runs it is usually shared, and CPU time per step drifts by tens of percent from one minute to the
next with the load around it. So two rows are always measured as a pair, in lock-step: two processes, one per row,
take turns step by step (a pipe hands the turn over; the waiting process is blocked and uses no CPU), so both see
the same load within a few milliseconds. A round runs every pair once; the figures are medians over rounds of each
pair's per-round ratio (or difference). The A/A pair (the fork against itself) shows the method's own spread.

    python -m bench.host_bench [--rounds 3] [--steps 270] [--out results/host.json] [--md results/host.md]

A worker (one row, one process) is this module run with ``--worker ROW``; it imports only the tree its
``PYTHONPATH`` points at. No test asserts these times; the tests check the method (tests/tests_fork/test_bench.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .report import stamp, write_json, write_markdown_page
from .trees import ROOT, default_pjrt_device, install_pl266, module_command, row_env
LAYERS = [64, 128, 10]
BATCH = 32
WORKER_ROWS = ("fork", "pl266", "lite", "hand", "base")
# (row A, row B, what the pair measures): each row paired with Lightning 2.6.6, the A/A pair, and the fork against
# Lite for the difference target
PAIRS: List[Tuple[str, str]] = [("fork", "pl266"), ("lite", "pl266"), ("hand", "pl266"), ("fork", "fork"),
                                ("fork", "lite")]
LABELS = {"fork": "fork Trainer", "pl266": "Lightning 2.6.6 Trainer", "lite": "fork Lite", "hand": "hand-written loop",
          "base": "fork Trainer (--base-path tree)"}
TARGET_RATIO = 0.85  # fork Trainer / 2.6.6 Trainer
TARGET_DIFF_MS = 0.7  # fork Trainer - fork Lite


# --------------------------------------------------------------------------------------------- worker side
class Turns:
    """The lock-step: after each step, tell the driver and wait for the next turn."""

    def __init__(self, done_fd: int, go_fd: int):
        self.done_fd, self.go_fd = done_fd, go_fd
        self.marks: List[float] = []

    def step_end(self) -> None:
        self.marks.append(time.thread_time())
        os.write(self.done_fd, b"s")
        if os.read(self.go_fd, 1) != b"g":
            raise SystemExit("host_bench: the driver went away")
        # the turn handover's own CPU time (two syscalls) is the same in every row; start the next step from here
        self.marks.append(time.thread_time())


def _per_step_ms(turns: Turns, warmup: int) -> List[float]:
    # marks: [end_0, resume_0, end_1, resume_1, ...]; a step is resume_{k-1} -> end_k
    ends, resumes = turns.marks[0::2], turns.marks[1::2]
    return [(e - r) * 1e3 for r, e in zip(resumes[warmup:], ends[warmup + 1:])]


def run_trainer(turns: Turns, steps: int, pl266: bool) -> Optional[float]:
    from . import bench_rows as rows  # torch: the worker's process only

    if pl266:
        rows.pl266_device_override()
    import pytorch_lightning as pl

    # the graph benchmark's module, as users write it: its loss on the progress bar every step
    Model = rows.make_module_class(pl)

    class Turn(pl.Callback):
        def on_train_batch_end(self, *args: Any, **kwargs: Any) -> None:
            turns.step_end()

    model = Model(LAYERS)
    with tempfile.TemporaryDirectory(prefix="host-bench-") as root:
        trainer = pl.Trainer(accelerator="tpu", devices=1, max_steps=steps, max_epochs=1, logger=False,
                             default_root_dir=root, callbacks=[Turn()])
        trainer.fit(model, rows.make_loader(LAYERS, BATCH, steps))
    return float(trainer.progress_bar_metrics["train_loss"])


def run_lite(turns: Turns, steps: int) -> Optional[float]:
    from . import bench_rows as rows  # torch: the worker's process only

    import torch.nn.functional as F
    from lightning_lite import LightningLite

    shown: List[float] = []

    class Loop(LightningLite):
        def run(self) -> None:
            net = rows.make_net(LAYERS)
            opt = rows.make_optimizer(net.parameters())
            net, opt = self.setup(net, opt)
            for x, y in self.setup_dataloaders(rows.make_loader(LAYERS, BATCH, steps)):
                opt.zero_grad()
                loss = F.cross_entropy(net(x), y)
                self.backward(loss)
                opt.step()
                shown.append(loss.item())
                turns.step_end()

    Loop(accelerator="tpu", devices=1).run()
    return shown[-1] if shown else None


def run_hand(turns: Turns, steps: int) -> Optional[float]:
    from . import bench_rows as rows  # torch: the worker's process only

    import torch_xla

    dev = torch_xla.device()
    net = rows.make_net(LAYERS).to(dev)
    opt = rows.make_optimizer(net.parameters())
    shown = None
    for x, y in rows.make_loader(LAYERS, BATCH, steps):
        loss = rows.hand_step(net, opt, x, y, dev)
        shown = loss.item()
        turns.step_end()
    return shown


def worker(args: argparse.Namespace) -> int:
    turns = Turns(args.done_fd, args.go_fd)
    if args.worker in ("fork", "pl266", "base"):
        last = run_trainer(turns, args.steps, pl266=args.worker == "pl266")
    elif args.worker == "lite":
        last = run_lite(turns, args.steps)
    else:
        last = run_hand(turns, args.steps)
    per_step = _per_step_ms(turns, args.warmup)
    out = {"row": args.worker, "steps": len(per_step), "median_ms": statistics.median(per_step),
           "last_loss": last}
    Path(args.out).write_text(json.dumps(out))
    os.close(args.done_fd)
    return 0


# --------------------------------------------------------------------------------------------- driver side
class Worker:
    def __init__(self, row: str, pythonpath: Optional[str], steps: int, warmup: int, python: str, log: Path):
        self.row = row
        done_r, done_w = os.pipe()
        go_r, go_w = os.pipe()
        self.out = tempfile.NamedTemporaryFile(prefix=f"host-{row}-", suffix=".json", delete=False).name
        cmd = module_command(python, "host_bench", "--worker", row, "--steps", str(steps), "--warmup", str(warmup),
                             "--done-fd", str(done_w), "--go-fd", str(go_r), "--out", self.out)
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=row_env(Path(pythonpath) if pythonpath else None), cwd=str(ROOT),
                                     pass_fds=(done_w, go_r), stdout=self.log, stderr=subprocess.STDOUT)
        os.close(done_w)
        os.close(go_r)
        self.done, self.go = done_r, go_w
        self.finished = False

    def wait_turn_end(self) -> bool:
        """Block until the worker ended a step (True) or exited (False)."""
        if self.finished:
            return False
        if os.read(self.done, 1) == b"s":
            return True
        self.finished = True
        return False

    def give_turn(self) -> None:
        os.write(self.go, b"g")

    def result(self) -> Dict[str, Any]:
        rc = self.proc.wait()
        self.log.close()
        os.close(self.done)
        os.close(self.go)
        if rc != 0:
            raise RuntimeError(f"host_bench worker {self.row} failed (exit {rc}); see {self.log.name}")
        return json.loads(Path(self.out).read_text())


def run_pair(a: str, b: str, paths: Dict[str, Optional[str]], steps: int, warmup: int, python: str,
             log_dir: Path, tag: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Rows ``a`` and ``b`` in two processes, taking turns step by step."""
    wa = Worker(a, paths[a], steps, warmup, python, log_dir / f"{tag}-{a}-A.log")
    wb = Worker(b, paths[b], steps, warmup, python, log_dir / f"{tag}-{b}-B.log")
    # both start up (import, compile) side by side, up to the end of their first step
    alive = [w for w in (wa, wb) if w.wait_turn_end()]
    while alive:
        for w in list(alive):
            w.give_turn()
            if not w.wait_turn_end():
                alive.remove(w)
    for w in (wa, wb):
        if not w.finished:
            w.give_turn()
    return wa.result(), wb.result()


def measure(rounds: int, steps: int, warmup: int, paths: Dict[str, Optional[str]], python: str,
            log_dir: Path, pairs: List[Tuple[str, str]] = PAIRS,
            runner: Callable = run_pair) -> Dict[str, Any]:
    log_dir.mkdir(parents=True, exist_ok=True)
    per_pair: Dict[str, List[Tuple[float, float]]] = {f"{a}|{b}": [] for a, b in pairs}
    for r in range(rounds):
        # the order of the pairs, and which row of a pair takes the first turn, alternate between rounds
        order = pairs if r % 2 == 0 else pairs[::-1]
        for a, b in order:
            first, second = (a, b) if r % 2 == 0 else (b, a)
            res_first, res_second = runner(first, second, paths, steps, warmup, python, log_dir, f"r{r}")
            res = {first: res_first, second: res_second} if first != second else None
            if res is None:  # the A/A pair: keep the order (A is the first-turn row this round)
                pa, pb = res_first["median_ms"], res_second["median_ms"]
            else:
                pa, pb = res[a]["median_ms"], res[b]["median_ms"]
            per_pair[f"{a}|{b}"].append((pa, pb))
            print(f"[host] round {r + 1}/{rounds}: {a} {pa:.3f} ms, {b} {pb:.3f} ms per step", flush=True)
    return {"rounds": rounds, "steps": steps, "warmup": warmup, "pairs": per_pair}


def summarize(result: Dict[str, Any]) -> Dict[str, Any]:
    rows = []
    for key, vals in result["pairs"].items():
        a, b = key.split("|")
        ratios = [x / y for x, y in vals]
        diffs = [x - y for x, y in vals]
        rows.append({"a": a, "b": b, "a_ms": statistics.median([x for x, _ in vals]),
                     "b_ms": statistics.median([y for _, y in vals]), "ratio": statistics.median(ratios),
                     "ratios": ratios, "diff_ms": statistics.median(diffs), "diffs_ms": diffs})
    by = {(r["a"], r["b"]): r for r in rows}
    targets = []
    if ("fork", "pl266") in by:
        v = by[("fork", "pl266")]["ratio"]
        targets.append({"name": "fork Trainer / Lightning 2.6.6 Trainer, host CPU per step", "value": v,
                        "goal": f"<= {TARGET_RATIO}", "met": v <= TARGET_RATIO, "unit": ""})
    if ("fork", "lite") in by:
        v = by[("fork", "lite")]["diff_ms"]
        targets.append({"name": "fork Trainer - fork Lite, host CPU per step", "value": v,
                        "goal": f"<= {TARGET_DIFF_MS} ms", "met": v <= TARGET_DIFF_MS, "unit": " ms"})
    spread = None
    if ("fork", "fork") in by:
        spread = max(abs(1 - x) for x in by[("fork", "fork")]["ratios"])
    return {"rows": rows, "targets": targets, "aa_spread": spread}


def markdown(result: Dict[str, Any], summary: Dict[str, Any]) -> str:
    lines = [
        "# Host CPU per step",
        "",
        f"CPU time of the training thread per steady step on the small MLP (64-128-10, batch 32), "
        f"median of {result['steps'] - result['warmup'] - 1} steps per run; two rows at a time in lock-step (two "
        f"processes taking turns step by step); {result['rounds']} rounds, the order alternating. Each figure is the "
        "median over rounds; `ratio` and `difference` are taken within each round's pair, then the median "
        "(each round's values in brackets). The A/A pair (the fork against itself) is the method's own spread.",
        "",
        "| pair | row A ms/step | row B ms/step | A / B | A - B (ms) |",
        "|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        name = f"{LABELS[r['a']]} vs {LABELS[r['b']]}" + (" (A/A)" if r["a"] == r["b"] else "")
        ratios = ", ".join(f"{x:.2f}" for x in r["ratios"])
        diffs = ", ".join(f"{x:+.2f}" for x in r["diffs_ms"])
        lines.append(f"| {name} | {r['a_ms']:.2f} | {r['b_ms']:.2f} | {r['ratio']:.2f} ({ratios}) "
                     f"| {r['diff_ms']:+.2f} ({diffs}) |")
    lines += ["", "Targets:", ""]
    for t in summary["targets"]:
        # three decimals: a value that rounds to its goal at two decimals still shows which side it is on
        lines.append(f"- {t['name']}: {t['value']:.3f}{t['unit']} (goal {t['goal']}): "
                     f"{'met' if t['met'] else 'NOT met'}")
    if summary["aa_spread"] is not None:
        lines.append(f"- A/A spread (largest |1 - ratio| of the fork against itself over the rounds): "
                     f"{summary['aa_spread']:.2f}")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=WORKER_ROWS)
    p.add_argument("--done-fd", type=int)
    p.add_argument("--go-fd", type=int)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=270)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--fork-path", default=None,
                   help="PYTHONPATH for the fork rows (default: none, the fork installed in the venv)")
    p.add_argument("--pl266-path", default=None, help="PYTHONPATH of Lightning 2.6.6 (default: build/bench/pl266)")
    p.add_argument("--base-path", default=None,
                   help="PYTHONPATH of another fork tree, the row `base` (to compare two versions of the fork)")
    p.add_argument("--pairs", default=None,
                   help="comma-separated A:B pairs of rows (fork, pl266, lite, hand, base); default: every row with "
                        "pl266, fork:lite and the A/A pair fork:fork")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", default=str(ROOT / "results" / "host.json"))
    p.add_argument("--md", default=str(ROOT / "results" / "host.md"))
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    default_pjrt_device()
    stamped = stamp(tree=args.fork_path or "the fork installed in the venv")
    pl266 = args.pl266_path or str(install_pl266(args.python)[0])
    paths = {"fork": args.fork_path, "lite": args.fork_path, "hand": None, "pl266": pl266, "base": args.base_path}
    pairs = PAIRS if not args.pairs else [tuple(p.split(":")) for p in args.pairs.split(",")]
    result = measure(args.rounds, args.steps, args.warmup, paths, args.python, ROOT / "build" / "bench" / "host-logs",
                     pairs=pairs)
    summary = summarize(result)
    write_json(Path(args.out), {"result": result, "summary": summary}, stamped)
    text = write_markdown_page(Path(args.md), markdown(result, summary), stamped)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
