"""A Llama-style decoder under FSDPv2 on every XLA device of the host: the fork's Trainer against pytorch/xla's own
FSDPv2 recipe and the Hugging Face Trainer, in float32 and ``bf16-mixed``, with and without activation checkpointing.

``python -m bench.llm_bench`` (``make bench-llm``) trains ``examples/llama_xla.py``'s model at ``--size bench``
(hidden 256, 2 layers, 4 heads, 2 KV heads, intermediate 1024, vocabulary 3200, sequence 256) with Adam (lr 3e-3),
global batch 16, on the same data: the repository's ``docs/*.md`` through the example's byte-level tokenizer, the same
windows in the same order, from the same initial weights. The rows:

- ``fork``: ``Trainer(strategy=XLASPMDFSDPStrategy(auto_wrap_policy=<DecoderLayer>,
  activation_checkpointing_policy={DecoderLayer} or None), precision=32 or "bf16-mixed")``, the example's
  LightningModule (the loss on the progress bar, which stays on);
- ``recipe``: pytorch/xla's ``examples/fsdp/train_decoder_only_fsdp_v2.py`` as written there (mesh ``(n, 1)``
  ``("fsdp", "model")``, ``FSDPv2`` with the transformer auto-wrap policy, ``MpDeviceLoader`` with
  ``input_sharding``, a ``torch_xla.compile``'d step), with ``checkpoint_module`` through ``auto_wrapper_callable``
  and ``torch.autocast("xla", dtype=torch.bfloat16)`` around the forward and the loss, as torch_xla's docs give them;
  the loss is read in a step closure every step (the recipe reads it every 10th);
- ``hf``: transformers' ``Trainer`` with ``fsdp_config={"xla": True, "xla_fsdp_v2": True, "xla_fsdp_grad_ckpt": ...}``
  on a ``LlamaForCausalLM`` of the same shape loaded with the same weights (``bench/llm_hf_row.py``, which says what
  it had to work around).

Every row runs in a fresh process; the rows of a configuration are interleaved in rounds, their order rotated (this
host is noisy). Each reports the wall time per steady step (from the end of the warm-up steps to the end of the run,
each end after ``xm.wait_device_ops()``), the loss of every step, and, in the first round, the compiled step's memory
from XLA's own buffer assignment (``XLA_FLAGS=--xla_dump_to``: the largest program's ``Total bytes used`` and its
temporary buffer). It writes ``results/llm.json`` and ``results/llm.md``. The target: the fork's time per step is at
most 1.05 times the recipe's in every configuration (median of the rounds' ratios), with the same losses.
"""
import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
ROWS = ("fork", "recipe", "hf")
CONFIGS = (("32", False), ("32", True), ("bf16-mixed", False), ("bf16-mixed", True))
TARGET = 1.05
BATCH = 16
LEARNING_RATE = 3e-3
LOSS_TOLERANCE = 1e-5


def _example() -> Any:
    sys.path.insert(0, str(ROOT / "examples"))
    import llama_xla

    return llama_xla


def _batches(example: Any, steps: int) -> List[Dict[str, Any]]:
    """``steps`` batches of ``BATCH`` windows of the repository's docs, in order: the same for every row."""
    import torch

    config = example.SIZES["bench"]
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md")))
    ids = torch.tensor(example.load_tokenizer("bytes")(text, add_special_tokens=False)["input_ids"])
    window = config.sequence + 1
    if len(ids) < steps * BATCH * window:
        raise SystemExit(f"docs/*.md give {len(ids) // window} windows of {window} tokens, fewer than {steps} batches"
                         f" of {BATCH}: ask for fewer --steps")
    windows = ids[: steps * BATCH * window].view(steps, BATCH, window)
    return [{"input_ids": w[:, :-1].contiguous(), "labels": w[:, 1:].contiguous()} for w in windows]


def _initial_state(example: Any) -> Dict[str, Any]:
    import torch

    torch.manual_seed(0)
    return example.Llama(example.SIZES["bench"]).state_dict()


def _fork_row(example: Any, batches: List[Dict[str, Any]], init: Dict[str, Any], precision: str,
              checkpointing: bool, warmup: int) -> Dict[str, Any]:
    import torch

    import pytorch_lightning as pl
    import torch_xla.core.xla_model as xm
    from pytorch_lightning.strategies import XLASPMDFSDPStrategy
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

    config = example.SIZES["bench"]
    times: Dict[str, float] = {}

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if batch_idx == warmup:
                xm.wait_device_ops()
                times["t0"] = time.perf_counter()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            xm.wait_device_ops()
            times["t1"] = time.perf_counter()

    module = example.lightning_module(config, LEARNING_RATE)
    module.model.load_state_dict(init)
    losses = example.loss_recorder()
    strategy = XLASPMDFSDPStrategy(
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={example.DecoderLayer}),
        activation_checkpointing_policy={example.DecoderLayer} if checkpointing else None,
    )
    trainer = pl.Trainer(accelerator="tpu", strategy=strategy, precision="bf16-mixed" if precision != "32" else 32,
                         max_steps=len(batches), callbacks=[Clock(), losses], logger=False, enable_checkpointing=False,
                         enable_model_summary=False)
    samples = [{k: v[i] for k, v in batch.items()} for batch in batches for i in range(BATCH)]
    trainer.fit(module, torch.utils.data.DataLoader(samples, batch_size=BATCH))
    return {"losses": [float(loss) for loss in losses.losses], **times}


def _recipe_row(example: Any, batches: List[Dict[str, Any]], init: Dict[str, Any], precision: str,
                checkpointing: bool, warmup: int) -> Dict[str, Any]:
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.parallel_loader as xpl
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.distributed.fsdp import checkpoint_module
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    config = example.SIZES["bench"]
    devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.array(range(devices)), (devices, 1), ("fsdp", "model"))
    xs.set_global_mesh(mesh)
    device = torch_xla.device()
    model = example.Llama(config)
    model.load_state_dict(init)
    model = model.to(device)
    wrapper = (lambda m, *args, **kwargs: FSDPv2(checkpoint_module(m), *args, **kwargs)) if checkpointing else None
    model = FSDPv2(model, auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                             transformer_layer_cls={example.DecoderLayer}),
                   auto_wrapper_callable=wrapper)
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    autocast = (lambda: torch.autocast("xla", dtype=torch.bfloat16)) if precision != "32" else nullcontext

    def step_fn(input_ids: Any, labels: Any) -> Any:
        optimizer.zero_grad()
        with autocast():
            loss = example.causal_lm_loss(model(input_ids), labels)
        loss.backward()
        optimizer.step()
        return loss

    compiled = torch_xla.compile(step_fn, full_graph=True, name="decoder_step_fn")
    loader = xpl.MpDeviceLoader([(b["input_ids"], b["labels"]) for b in batches], device,
                                input_sharding=xs.ShardingSpec(mesh, ("fsdp", None)))
    losses: List[float] = []
    times: Dict[str, float] = {}
    model.train()
    for step, (input_ids, labels) in enumerate(loader):
        if step == warmup:
            xm.wait_device_ops()
            times["t0"] = time.perf_counter()
        loss = compiled(input_ids, labels)
        xm.add_step_closure(lambda value: losses.append(float(value)), args=(loss,))
    xm.mark_step()  # runs the last step's closure
    xm.wait_device_ops()
    times["t1"] = time.perf_counter()
    return {"losses": losses, **times}


def worker(args: argparse.Namespace) -> Dict[str, Any]:
    import torch_xla.runtime as xr

    xr.use_spmd()
    example = _example()
    batches = _batches(example, args.steps)
    init = _initial_state(example)
    if args.worker == "fork":
        out = _fork_row(example, batches, init, args.precision, args.checkpointing, args.warmup)
    elif args.worker == "recipe":
        out = _recipe_row(example, batches, init, args.precision, args.checkpointing, args.warmup)
    else:
        from .llm_hf_row import run

        out = run(batches, init, example.SIZES["bench"], args.precision, args.checkpointing, LEARNING_RATE,
                  args.warmup)
    steady = args.steps - args.warmup
    out["step_s"] = (out["t1"] - out["t0"]) / steady
    out["devices"] = xr.global_runtime_device_count()
    return out


def compiled_memory(dump: Path) -> Optional[Dict[str, Any]]:
    """The largest compiled program in an XLA dump (by ``Total bytes used`` of its buffer assignment): that and its
    temporary buffer (``preallocated-temp``), in bytes."""
    best: Optional[Dict[str, Any]] = None
    for path in dump.glob("*buffer-assignment.txt"):
        text = path.read_text(errors="replace")
        total = re.search(r"^Total bytes used: (\d+)", text, re.M)
        if total is None:
            continue
        temp = sum(int(m.group(1)) for m in re.finditer(r"^allocation \d+: size (\d+), preallocated-temp", text, re.M))
        if best is None or int(total.group(1)) > best["total_bytes"]:
            best = {"program": path.name.split(".")[0] + "." + path.name.split(".")[1],
                    "total_bytes": int(total.group(1)), "temp_bytes": temp}
    return best


HF_PACKAGES = ROOT / "build" / "bench" / "hf"
HF_REQUIREMENTS = ROOT / "requirements" / "bench-hf.txt"


def install_hf_packages() -> Path:
    """``requirements/bench-hf.txt`` in ``build/bench/hf`` (``pip install --no-deps --target``), once per version of
    that file: the HF row's packages, kept out of the venv that the tests run in."""
    import hashlib

    marker = HF_PACKAGES / f".installed-{hashlib.sha256(HF_REQUIREMENTS.read_bytes()).hexdigest()[:12]}"
    if not marker.exists():
        shutil.rmtree(HF_PACKAGES, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-deps",
                        "--target", str(HF_PACKAGES), "-r", str(HF_REQUIREMENTS)], check=True)
        marker.touch()
    return HF_PACKAGES


def _run(row: str, precision: str, checkpointing: bool, args: argparse.Namespace, log: Path,
         dump: Optional[Path]) -> Dict[str, Any]:
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    env.setdefault("CPU_NUM_DEVICES", str(args.devices))
    env["HF_HUB_OFFLINE"] = "1"
    paths = [str(ROOT / "src") if (ROOT / "src").is_dir() else "", str(HF_PACKAGES) if row == "hf" else "",
             env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if dump is not None:
        shutil.rmtree(dump, ignore_errors=True)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()
    cmd = [sys.executable, "-m", "bench.llm_bench", "--worker", row, "--precision", precision, "--steps",
           str(args.steps), "--warmup", str(args.warmup)] + (["--checkpointing"] if checkpointing else [])
    with open(log, "w") as err:
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {args.timeout:.0f} s: see {log}"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: see {log}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if dump is not None:
        result["memory"] = compiled_memory(dump)
        shutil.rmtree(dump, ignore_errors=True)
    return result


def _key(precision: str, checkpointing: bool) -> str:
    return f"{precision}{' + ckpt' if checkpointing else ''}"


def summarize(rounds: List[Dict[str, Dict[str, Any]]]) -> Dict[str, Any]:
    summary: Dict[str, Any] = {}
    for precision, checkpointing in CONFIGS:
        key = _key(precision, checkpointing)
        entry: Dict[str, Any] = {}
        for row in ROWS:
            ok = [r[key][row] for r in rounds if "error" not in r[key][row]]
            errors = [r[key][row]["error"] for r in rounds if "error" in r[key][row]]
            entry[row] = {"step_s": statistics.median(x["step_s"] for x in ok) if ok else None,
                          "rounds": len(ok), "errors": errors,
                          "losses": ok[0]["losses"] if ok else None,
                          "memory": next((x["memory"] for x in ok if x.get("memory")), None)}
        ratios = [r[key]["fork"]["step_s"] / r[key]["recipe"]["step_s"] for r in rounds
                  if "error" not in r[key]["fork"] and "error" not in r[key]["recipe"]]
        entry["fork_over_recipe"] = statistics.median(ratios) if ratios else None
        entry["round_ratios"] = ratios
        fork, recipe = entry["fork"]["losses"], entry["recipe"]["losses"]
        entry["fork_recipe_loss_difference"] = (max(abs(a - b) for a, b in zip(fork, recipe))
                                                if fork and recipe and len(fork) == len(recipe) else None)
        hf = entry["hf"]["losses"]
        entry["hf_fork_loss_difference"] = (max(abs(a - b) for a, b in zip(fork, hf))
                                            if fork and hf and len(fork) == len(hf) else None)
        entry["target_met"] = (entry["fork_over_recipe"] is not None and entry["fork_over_recipe"] <= TARGET
                               and entry["fork_recipe_loss_difference"] is not None
                               and entry["fork_recipe_loss_difference"] <= LOSS_TOLERANCE)
        summary[key] = entry
    return summary


def _mb(memory: Optional[Dict[str, Any]], field: str) -> str:
    return f"{memory[field] / 2**20:.1f}" if memory else "n/a"


def markdown(summary: Dict[str, Any], rounds: List[Dict[str, Dict[str, Any]]], args: argparse.Namespace,
             hf_notes: List[str]) -> str:
    lines = [
        "# A Llama-style decoder under FSDPv2: the fork's Trainer, pytorch/xla's recipe, the HF Trainer", "",
        f"`examples/llama_xla.py --size bench` (hidden 256, 2 layers, 4 heads, 2 KV heads, intermediate 1024, vocabulary"
        f" 3200, sequence 256), Adam lr {LEARNING_RATE}, global batch {BATCH}, {args.devices} XLA devices"
        f" ({os.environ.get('PJRT_DEVICE', 'CPU')}), {args.steps} steps of which {args.warmup} warm-up; the same"
        " windows of `docs/*.md` (UTF-8 bytes) in the same order from the same weights. Each row in a fresh process,"
        f" {args.rounds} rounds, the rows' order rotated; time per steady step is the median of the rounds. Memory: the"
        " largest compiled program's buffer assignment (first round): `Total bytes used` and its temporary buffer.",
        "",
        "| configuration | row | ms / step | fork / recipe | last loss | max loss difference | program MB | temp MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, entry in summary.items():
        for row in ROWS:
            e = entry[row]
            ms = (f"{e['step_s'] * 1e3:.0f}" if e["step_s"] else
                  "not run" if all(err.startswith("not run") for err in e["errors"]) else "failed")
            ratio = f"{entry['fork_over_recipe']:.3f}" if row == "fork" and entry["fork_over_recipe"] else ""
            last = f"{e['losses'][-1]:.5f}" if e["losses"] else ""
            diff = {"fork": "", "recipe": entry["fork_recipe_loss_difference"],
                    "hf": entry["hf_fork_loss_difference"]}[row]
            diff = f"{diff:.2e} (to fork)" if isinstance(diff, float) else ""
            lines.append(f"| {key} | {row} | {ms} | {ratio} | {last} | {diff} | {_mb(e['memory'], 'total_bytes')} |"
                         f" {_mb(e['memory'], 'temp_bytes')} |")
    lines += ["", "Per round, fork / recipe: " + "; ".join(
        f"{key}: " + ", ".join(f"{r:.3f}" for r in entry["round_ratios"]) for key, entry in summary.items()), ""]
    met = all(entry["target_met"] for entry in summary.values())
    lines += [f"Target: fork / recipe <= {TARGET} in every configuration, losses equal to {LOSS_TOLERANCE}: "
              f"{'met' if met else 'NOT met'}.", ""]
    if hf_notes:
        lines += ["The HF row (`bench/llm_hf_row.py`):", ""] + [f"- {note}" for note in hf_notes] + [""]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=ROWS)
    parser.add_argument("--precision", choices=("32", "bf16-mixed"), default="32")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--devices", type=int, default=int(os.environ.get("CPU_NUM_DEVICES", "4")))
    parser.add_argument("--rows", default=",".join(ROWS), help="a comma-separated subset of " + ",".join(ROWS))
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    if args.steps < args.warmup + 2:
        parser.error("--steps must exceed --warmup by at least 2")
    if args.worker:
        print("\n" + json.dumps(worker(args)), flush=True)
        return 0
    from . import report

    rows = [r for r in args.rows.split(",") if r]
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {unknown}; choose from {','.join(ROWS)}")
    if "hf" in rows:
        install_hf_packages()
    stamped = report.stamp()
    logs = ROOT / "build" / "bench" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    dumps = ROOT / "build" / "bench" / "llm-dumps"
    rounds: List[Dict[str, Dict[str, Any]]] = []
    for i in range(args.rounds):
        results: Dict[str, Dict[str, Any]] = {}
        for precision, checkpointing in CONFIGS:
            key = _key(precision, checkpointing)
            results[key] = {row: {"error": "not run (--rows)"} for row in ROWS}
            order = rows[i % len(rows):] + rows[: i % len(rows)]
            for row in order:
                tag = f"{row}-{precision}-{'ckpt' if checkpointing else 'plain'}-{i}"
                results[key][row] = _run(row, precision, checkpointing, args, logs / f"llm-{tag}.log",
                                         dumps / tag if i == 0 else None)
                shown = {k: v for k, v in results[key][row].items() if k not in ("losses", "notes")}
                print(f"round {i + 1} {key} {row}: {json.dumps(shown)}", flush=True)
        rounds.append(results)
    summary = summarize(rounds)
    hf_notes = list(dict.fromkeys(note for r in rounds for k in r for note in r[k]["hf"].get("notes", [])))
    data = {"config": vars(args), "rounds": rounds, "summary": summary}
    report.write_json(RESULTS / "llm.json", data, stamped)
    text = report.write_markdown_page(RESULTS / "llm.md", markdown(summary, rounds, args, hf_notes), stamped)
    print(text)
    return 0 if all(entry["target_met"] for entry in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
