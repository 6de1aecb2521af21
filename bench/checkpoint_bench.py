"""What a checkpoint costs the training thread on XLA: synchronous writes against writes in the background.

``python -m bench.checkpoint_bench`` (``make bench-checkpoint``; ``make bench`` runs it too) trains a 10-layer,
2048-wide MLP with Adam (about 500 MB of state: weights and two moments) with
``ModelCheckpoint(every_n_train_steps=5)``, every row in a fresh process, the rows interleaved in rounds (this host is
noisy):

- ``none``: no checkpoint, the run the others are compared with;
- ``sync``: ``PL_XLA_BACKGROUND_CHECKPOINT_WRITES=0``, each save serialised and written on the training thread, as
  1.8.6 does;
- ``background``: the fork's default, the copy to the host on the training thread, the rest on a writer thread.

For every save the row records, on the training thread: the stall (``trainer.save_checkpoint`` from
``ModelCheckpoint``, from its call to its return) and, inside it, the wait for the step's device work that the copy
needs first (timed apart: ``xm.wait_device_ops()`` just before the copy, which would wait for it anyway) and the copy of
the state to the host. Each row also copies the same state once more at the end of ``fit``, with nothing pending and no
write in flight (the quiet copy, three times). What a save adds is its stall less the wait for the step (work the step
owes anyway); the target: in the background, at most 1.5 times the quiet copy. The fit times give the same cost
another way: (``background`` - ``none``) / saves. It writes ``results/checkpoint.json`` and ``results/checkpoint.md``.
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
ROWS = ("none", "sync", "background")
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

    waits: List[float] = []

    def timed_copy(*a: Any, **k: Any) -> Any:
        import torch_xla.core.xla_model as xm

        t0 = time.perf_counter()
        # the step's device work, which the copy waits for first
        xm.wait_device_ops()
        t1 = time.perf_counter()
        waits.append(t1 - t0)
        try:
            return real_copy(*a, **k)
        finally:
            copies.append(time.perf_counter() - t1)

    xla_io._xla_tensors_to_cpu = timed_copy

    import torch_xla.core.xla_model as xm

    quiet: List[float] = []

    class TimedCheckpoint(ModelCheckpoint):
        # the write itself: on XLA `ModelCheckpoint` decides in the batch's hooks and writes once the batch is over
        def _write_checkpoint(self, trainer: "pl.Trainer", filepath: str) -> None:
            before = len(copies)
            t0 = time.perf_counter()
            super()._write_checkpoint(trainer, filepath)
            stall = time.perf_counter() - t0
            saves.append({"step": trainer.global_step, "stall_s": stall, "wait_s": sum(waits[before:]),
                          "copy_s": sum(copies[before:])})

    class QuietCopy(pl.Callback):
        def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
            # the copy on its own: the same state (weights and both moments), nothing pending on the device, no write
            # in flight (they landed before `on_train_end`), three times
            tensors = [t for t in pl_module.state_dict().values()]
            for state in trainer.optimizers[0].state.values():
                tensors += [v for v in state.values() if isinstance(v, torch.Tensor) and v.device.type == "xla"]
            xm.wait_device_ops()
            for _ in range(3):
                t0 = time.perf_counter()
                xm._maybe_convert_to_cpu(tensors)
                quiet.append(time.perf_counter() - t0)

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
        callbacks: List[pl.Callback] = [QuietCopy()]
        if args.worker != "none":
            callbacks.append(TimedCheckpoint(dirpath=folder, every_n_train_steps=args.every, save_top_k=-1))
        trainer = pl.Trainer(accelerator="tpu", devices=1, max_steps=args.steps, logger=False,
                             enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                             default_root_dir=folder, enable_checkpointing=args.worker != "none")
        t0 = time.perf_counter()
        trainer.fit(model)
        fit_s = time.perf_counter() - t0
        sizes = [os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".ckpt")]
    # the first save compiles what the copy needs; the steady saves follow
    steady = saves[1:] or saves
    result: Dict[str, Any] = {
        "row": args.worker,
        "saves": saves,
        "fit_s": fit_s,
        "state_mb": state_bytes / 2**20,
        "checkpoint_mb": (max(sizes) if sizes else 0) / 2**20,
        "quiet_copy_s": statistics.median(quiet),
    }
    if saves:
        for key in ("stall_s", "wait_s", "copy_s"):
            result[key] = statistics.median(s[key] for s in steady)
        # what the save adds: its stall less the step's own device work
        result["added_s"] = statistics.median(s["stall_s"] - s["wait_s"] for s in steady)
    return result


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
    lines = ["| round | row | stall per save | wait for the step | copy to host | added (stall - wait) |"
             " quiet copy | added / quiet copy | fit |", "|---|---|---|---|---|---|---|---|---|"]
    for i, results in enumerate(rounds, 1):
        for row in ROWS:
            r = results[row]
            if "error" in r:
                lines.append(f"| {i} | {row} | {r['error']} | | | | | | |")
                continue
            if row == "none":
                lines.append(f"| {i} | {row} | | | | | {r['quiet_copy_s']:.3f} s | | {r['fit_s']:.1f} s |")
                continue
            lines.append(f"| {i} | {row} | {r['stall_s']:.3f} s | {r['wait_s']:.3f} s | {r['copy_s']:.3f} s |"
                         f" {r['added_s']:.3f} s | {r['quiet_copy_s']:.3f} s | {r['added_s'] / r['quiet_copy_s']:.2f} |"
                         f" {r['fit_s']:.1f} s |")
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
    parser.add_argument("--page", action="store_true",
                        help="write results/checkpoint.md again from results/checkpoint.json (same stamp), measure nothing")
    args = parser.parse_args(argv)
    if args.page:
        from . import report

        data = json.loads((RESULTS / "checkpoint.json").read_text())
        report.write_markdown_page(RESULTS / "checkpoint.md", page(data), data["stamp"])
        return 0
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
            keys = ("fit_s", "quiet_copy_s") if row == "none" else (
                "stall_s", "wait_s", "copy_s", "added_s", "quiet_copy_s", "fit_s")
            summary[row] = {key: statistics.median(r[row][key] for r in ok) for key in keys}
        summary["state_mb"] = ok[0]["background"]["state_mb"]
        summary["checkpoint_mb"] = ok[0]["background"]["checkpoint_mb"]
        background = summary["background"]
        saves = len(ok[0]["background"]["saves"])
        summary["saves"] = saves
        summary["background_added_over_quiet_copy"] = background["added_s"] / background["quiet_copy_s"]
        summary["background_stall_over_quiet_copy"] = background["stall_s"] / background["quiet_copy_s"]
        # the same cost from the fit times, per round (the rows of a round ran side by side)
        summary["background_fit_cost_per_save_s"] = statistics.median(
            (r["background"]["fit_s"] - r["none"]["fit_s"]) / saves for r in ok)
        summary["sync_fit_cost_per_save_s"] = statistics.median(
            (r["sync"]["fit_s"] - r["none"]["fit_s"]) / saves for r in ok)
        summary["sync_stall_over_background_stall"] = summary["sync"]["stall_s"] / background["stall_s"]
        summary["target_met"] = summary["background_added_over_quiet_copy"] <= TARGET
    data = {"config": vars(args), "rounds": rounds, "summary": summary}
    report.write_json(RESULTS / "checkpoint.json", data, stamped)
    md = page(data)
    report.write_markdown_page(RESULTS / "checkpoint.md", md, stamped)
    print(md)
    return 0 if summary and summary["target_met"] else 1


def page(data: Dict[str, Any]) -> str:
    """``results/checkpoint.md`` from the result ``data`` (``--page`` writes it again from ``results/checkpoint.json``)."""
    config, rounds, summary = data["config"], data["rounds"], data["summary"]
    md = ["# Checkpoint stall on XLA: synchronous writes against writes in the background", "",
          f"A {config['layers']}-layer {config['width']}-wide MLP with Adam,"
          f" `ModelCheckpoint(every_n_train_steps={config['every']})`, {config['steps']} steps; each row in a fresh"
          f" process, rows interleaved over {config['rounds']} rounds; medians over the saves after the first. Stall:"
          " what `trainer.save_checkpoint` costs the training thread; inside it, the wait for the step's device work"
          " (which the copy needs first) and the copy of the state to the host. Added: the stall less that wait."
          " Quiet copy: the same state copied again at the end of `fit`, nothing pending, no write in flight.", "",
          *_table(rounds), ""]
    if summary:
        b = summary["background"]
        md += [f"State {summary['state_mb']:.0f} MB, checkpoint file {summary['checkpoint_mb']:.0f} MB. Background"
               f" writes: a save stalls the training thread {b['stall_s']:.3f} s, of which {b['wait_s']:.3f} s wait"
               f" for the step's own device work; it adds {b['added_s']:.3f} s ="
               f" {summary['background_added_over_quiet_copy']:.2f} x the quiet copy of {b['quiet_copy_s']:.3f} s"
               f" (target <= {TARGET}: {'met' if summary['target_met'] else 'NOT met'}; the whole stall is"
               f" {summary['background_stall_over_quiet_copy']:.2f} x). From the fit times, a save costs"
               f" {summary['background_fit_cost_per_save_s']:.3f} s in the background and"
               f" {summary['sync_fit_cost_per_save_s']:.3f} s written synchronously; synchronous writes stall"
               f" {summary['sync_stall_over_background_stall']:.1f} x longer.", "",
               f"The fit-time cost of a background save is"
               f" {summary['background_fit_cost_per_save_s'] / b['stall_s']:.1f} x its stall: here the XLA device is"
               " these same 2 CPU cores, and the writer thread's serialisation and write take cores from the device's"
               " computation of the next steps. On a TPU the writer takes host cores only (the input pipeline's); this"
               " host cannot show how much of that cost remains there.", ""]
    return "\n".join(md)


if __name__ == "__main__":
    sys.exit(main())
