"""What a checkpoint costs the training thread on XLA: synchronous writes against writes in the background.

``python -m bench.checkpoint_bench`` (``make bench-checkpoint``; ``make bench`` runs it too) trains a 10-layer,
2048-wide MLP with Adam (about 500 MB of state: weights and two moments) with
``ModelCheckpoint(every_n_train_steps=5)``, every row in a fresh process, the two rows interleaved in rounds (this
host is noisy):

- ``sync``: ``PL_XLA_BACKGROUND_CHECKPOINT_WRITES=0``, each save serialised and written on the training thread, as
  1.8.6 does;
- ``background``: the fork's default, the copy to the host on the training thread, the rest on a writer thread.

For every save the row records, on the training thread: the stall (``trainer.save_checkpoint`` from
``ModelCheckpoint``, from its call to its return: building the state, waiting for a write still in flight, copying
to the host, and for ``sync`` serialising and writing) and, inside it, the copy of the state to the host. The target:
with background writes the stall is at most 1.5 times the copy. It writes ``results/checkpoint.json`` and
``results/checkpoint.md``.
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
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
ROWS = ("sync", "background")
TARGET = 1.5


def worker(args: argparse.Namespace) -> Dict[str, Any]:
    import torch

    import pytorch_lightning as pl
    from lightning_lite.plugins.io import xla as xla_io
    from pytorch_lightning.callbacks import ModelCheckpoint

    torch.manual_seed(0)
    saves: List[Dict[str, float]] = []
    copies: List[float] = []
    real_copy = xla_io._xla_tensors_to_cpu

    def timed_copy(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return real_copy(*a, **k)
        finally:
            copies.append(time.perf_counter() - t0)

    xla_io._xla_tensors_to_cpu = timed_copy

    class TimedCheckpoint(ModelCheckpoint):
        # the write itself: on XLA `ModelCheckpoint` decides in the batch's hooks and writes once the batch is over
        def _write_checkpoint(self, trainer: "pl.Trainer", filepath: str) -> None:
            before = len(copies)
            t0 = time.perf_counter()
            super()._write_checkpoint(trainer, filepath)
            stall = time.perf_counter() - t0
            saves.append({"step": trainer.global_step, "stall_s": stall, "copy_s": sum(copies[before:])})

    width, layers = args.width, args.layers

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            (x,) = batch
            return self.net(x).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            data = torch.utils.data.TensorDataset(torch.randn(args.steps * 8, width))
            return torch.utils.data.DataLoader(data, batch_size=8)

    model = MLP()
    state_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
    with tempfile.TemporaryDirectory(dir=args.tmp) as folder:
        checkpoint = TimedCheckpoint(dirpath=folder, every_n_train_steps=args.every, save_top_k=-1)
        trainer = pl.Trainer(accelerator="tpu", devices=1, max_steps=args.steps, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=[checkpoint],
                             default_root_dir=folder)
        t0 = time.perf_counter()
        trainer.fit(model)
        fit_s = time.perf_counter() - t0
        sizes = [os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".ckpt")]
    # the first save compiles what the copy needs; the steady saves follow
    steady = saves[1:] or saves
    return {
        "row": args.worker,
        "saves": saves,
        "fit_s": fit_s,
        "state_mb": state_bytes / 2**20,
        "checkpoint_mb": (max(sizes) if sizes else 0) / 2**20,
        "stall_s": statistics.median(s["stall_s"] for s in steady),
        "copy_s": statistics.median(s["copy_s"] for s in steady),
    }


def _run_row(row: str, args: argparse.Namespace, log: Path) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "PL_XLA_BACKGROUND_CHECKPOINT_WRITES"}
    env.setdefault("PJRT_DEVICE", "CPU")
    if row == "sync":
        env["PL_XLA_BACKGROUND_CHECKPOINT_WRITES"] = "0"
    cmd = [sys.executable, "-m", "bench.checkpoint_bench", "--worker", row, "--steps", str(args.steps), "--every",
           str(args.every), "--width", str(args.width), "--layers", str(args.layers), "--tmp", args.tmp]
    with open(log, "w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=out, text=True,
                              timeout=args.timeout)
    if proc.returncode != 0:
        return {"row": row, "error": f"exit {proc.returncode}: see {log}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(rounds: List[Dict[str, Dict[str, Any]]]) -> List[str]:
    lines = ["| round | row | stall per save | copy to host | stall / copy | fit |", "|---|---|---|---|---|---|"]
    for i, results in enumerate(rounds, 1):
        for row in ROWS:
            r = results[row]
            if "error" in r:
                lines.append(f"| {i} | {row} | {r['error']} | | | |")
                continue
            lines.append(f"| {i} | {row} | {r['stall_s']:.3f} s | {r['copy_s']:.3f} s | "
                         f"{r['stall_s'] / r['copy_s']:.2f} | {r['fit_s']:.1f} s |")
    return lines


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=ROWS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--tmp", default=str(ROOT / "build" / "bench" / "checkpoints"))
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args(argv)
    Path(args.tmp).mkdir(parents=True, exist_ok=True)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    from . import report

    stamped = report.stamp()
    logs = ROOT / "build" / "bench" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    rounds = []
    for i in range(args.rounds):
        results = {}
        for row in ROWS if i % 2 == 0 else tuple(reversed(ROWS)):
            results[row] = _run_row(row, args, logs / f"checkpoint-{row}-{i}.log")
            print(f"round {i + 1} {row}: {json.dumps({k: v for k, v in results[row].items() if k != 'saves'})}",
                  flush=True)
        rounds.append(results)
    ok = [r for r in rounds if all("error" not in r[row] for row in ROWS)]
    summary: Dict[str, Any] = {}
    if ok:
        for row in ROWS:
            summary[row] = {key: statistics.median(r[row][key] for r in ok) for key in ("stall_s", "copy_s", "fit_s")}
        summary["state_mb"] = ok[0]["background"]["state_mb"]
        summary["checkpoint_mb"] = ok[0]["background"]["checkpoint_mb"]
        background = summary["background"]
        summary["background_stall_over_copy"] = background["stall_s"] / background["copy_s"]
        summary["sync_stall_over_background_stall"] = summary["sync"]["stall_s"] / background["stall_s"]
        summary["target_met"] = summary["background_stall_over_copy"] <= TARGET
    data = {"config": vars(args), "rounds": rounds, "summary": summary}
    report.write_json(RESULTS / "checkpoint.json", data, stamped)
    md = ["# Checkpoint stall on XLA: synchronous writes against writes in the background", "",
          f"A {args.layers}-layer {args.width}-wide MLP with Adam, `ModelCheckpoint(every_n_train_steps={args.every})`,"
          f" {args.steps} steps; each row in a fresh process, rows interleaved over {args.rounds} rounds;"
          " medians over the saves after the first. Stall: what `trainer.save_checkpoint` costs the training thread;"
          " copy: the copy of the state to the host inside it.", "", *_table(rounds), ""]
    if summary:
        md += [f"State {summary['state_mb']:.0f} MB, checkpoint file {summary['checkpoint_mb']:.0f} MB. Background"
               f" writes: stall {summary['background']['stall_s']:.3f} s = "
               f"{summary['background_stall_over_copy']:.2f} x the copy (target <= {TARGET}:"
               f" {'met' if summary['target_met'] else 'NOT met'}); synchronous writes stall"
               f" {summary['sync_stall_over_background_stall']:.1f} x longer.", ""]
    report.write_markdown_page(RESULTS / "checkpoint.md", "\n".join(md), stamped)
    print("\n".join(md))
    return 0 if summary and summary["target_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
