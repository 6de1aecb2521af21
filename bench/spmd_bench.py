"""The SPMD benchmark (`make bench-spmd`): what a steady training step costs with the fork's SPMD strategies against
a hand-written SPMD loop, and how many bytes of parameters and optimizer state each device holds with data parallel
and with FSDPv2.

It runs in one process that drives every XLA device it has (``CPU_NUM_DEVICES``, default 4, on XLA:CPU; all chips
of the host on a TPU VM) and writes ``results/spmd.md`` and ``results/spmd.json``. Counts are exact; times on a
shared 2-core machine are not (see bench/README.md), so they are printed for reference only.
"""
import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import torch

from .report import stamp, write_json, write_markdown_page
from .trees import ROOT

BATCH = 64


def counters() -> Dict[str, int]:
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    xm.wait_device_ops()

    def value(name: str) -> int:
        data = met.metric_data(name)
        return 0 if data is None else int(data[0])

    return {
        "compiles": value("CompileTime"),
        "executions": value("ExecuteTime") + value("ExecuteReplicatedTime"),
        "transfers": value("TransferFromDeviceTime"),
    }


def per_step(before: Dict[str, int], after: Dict[str, int], steps: int) -> Dict[str, float]:
    return {k: (after[k] - before[k]) / steps for k in after}


def mlp(widths: List[int]) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: List[torch.nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def data(widths: List[int], steps: int) -> List:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps * BATCH, widths[0], generator=g)
    y = torch.randint(0, widths[-1], (len(x),), generator=g)
    return list(zip(x, y))


def bytes_on_device(tensors, device: int = 0) -> int:
    """Bytes ``tensors`` occupy on XLA device ``device``: a replicated tensor whole, a sharded one its shard."""
    import torch_xla

    total = 0
    for t in tensors:
        if torch_xla._XLAC._get_xla_sharding_spec(t):
            t = torch_xla._XLAC._get_local_shards([t])[0][device][0]
        total += t.numel() * t.element_size()
    return total


def state_tensors(optimizers) -> List[torch.Tensor]:
    return [v for opt in optimizers for st in opt.state.values() for v in st.values()
            if isinstance(v, torch.Tensor) and v.device.type == "xla" and v.dim()]


def hand_loop(fsdp: bool, widths: List[int], steps: int, warm_up: int, optimizer: str) -> Dict[str, Any]:
    """The loop a PT/XLA user writes by hand: mesh, annotations, forward, backward, step, barrier, loss read."""
    import numpy as np
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    n = xr.global_runtime_device_count()
    axis = "fsdp" if fsdp else "data"
    mesh = xs.Mesh(np.arange(n), (n,), (axis,))
    device = torch_xla.device()
    model = mlp(widths).to(device)
    if fsdp:
        from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

        model = SpmdFullyShardedDataParallel(model, mesh=mesh)
    else:
        for p in model.parameters():
            xs.mark_sharding(p, mesh, (None,) * p.dim())
    opt = make_optimizer(optimizer, model.parameters())
    loader = torch.utils.data.DataLoader(data(widths, steps), batch_size=BATCH)
    times, start = [], None
    for i, (x, y) in enumerate(loader):
        if i == warm_up:
            start = counters()
        t0 = time.perf_counter()
        x = xm.send_cpu_data_to_device([x], device, xs.ShardingSpec(mesh, (axis, None)))[0]
        y = xm.send_cpu_data_to_device([y], device, xs.ShardingSpec(mesh, (axis,)))[0]
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch_xla.sync()
        loss.item()
        times.append(time.perf_counter() - t0)
    result = per_step(start, counters(), steps - warm_up)
    result["s_per_step"] = sorted(times[warm_up:])[(steps - warm_up) // 2]
    result["bytes_device0"] = bytes_on_device(list(model.parameters()) + state_tensors([opt]))
    return result


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-3) if name == "adam" else torch.optim.SGD(params, lr=0.05)


def trainer_row(strategy: str, widths: List[int], steps: int, warm_up: int, optimizer: str) -> Dict[str, Any]:
    from pytorch_lightning import Callback, LightningModule, Trainer

    record: Dict[str, Any] = {"times": []}

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mlp(widths)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.net(x), y)
            self.log("loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return make_optimizer(optimizer, self.parameters())

        def train_dataloader(self):
            return torch.utils.data.DataLoader(data(widths, steps), batch_size=BATCH)

    class Measure(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == warm_up:
                record["start"] = counters()
            record["t0"] = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            record["times"].append(time.perf_counter() - record["t0"])
            if batch_idx == steps - 1:
                record.update(per_step(record["start"], counters(), steps - warm_up))
                record["bytes_device0"] = bytes_on_device(list(pl_module.parameters())
                                                          + state_tensors(trainer.optimizers))

    trainer = Trainer(accelerator="tpu", strategy=strategy, max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_model_summary=False, callbacks=[Measure()], default_root_dir=str(ROOT / "build" / "bench"))
    trainer.fit(Model())
    times = record.pop("times")[warm_up:]
    record.pop("start")
    record.pop("t0")
    record["s_per_step"] = sorted(times)[len(times) // 2]
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warm-up", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "results" / "spmd"))
    args = parser.parse_args(argv)
    if "PJRT_DEVICE" not in os.environ or "CPU_NUM_DEVICES" not in os.environ:
        # the fork takes XLA on the CPU only from the environment the process started with: start again with it
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        os.environ.setdefault("CPU_NUM_DEVICES", "4")
        os.execv(sys.executable, [sys.executable, "-m", "bench.spmd_bench", *sys.argv[1:]])

    import torch_xla
    import torch_xla.runtime as xr

    xr.use_spmd()
    devices = xr.global_runtime_device_count()
    small = [64, 128, 10]
    wide = [512, 2048, 2048, 512]
    rows: List[Dict[str, Any]] = []

    def run(name: str, fn: Callable, *fn_args: Any) -> None:
        print(f"spmd_bench: {name}", file=sys.stderr, flush=True)
        rows.append({"row": name, **fn(*fn_args)})

    # counts: the small MLP with SGD, the loss read on the host every step
    run("hand-written SPMD loop, data parallel", hand_loop, False, small, args.steps, args.warm_up, "sgd")
    run('Trainer(strategy="xla_spmd")', trainer_row, "xla_spmd", small, args.steps, args.warm_up, "sgd")
    run("hand-written SPMD loop, FSDPv2", hand_loop, True, small, args.steps, args.warm_up, "sgd")
    run('Trainer(strategy="xla_spmd_fsdp")', trainer_row, "xla_spmd_fsdp", small, args.steps, args.warm_up, "sgd")
    # memory: a wider MLP with Adam (two state tensors per parameter), a few steps
    memory = []
    for strategy in ("xla_spmd", "xla_spmd_fsdp"):
        print(f"spmd_bench: memory, {strategy}", file=sys.stderr, flush=True)
        memory.append({"strategy": strategy, **trainer_row(strategy, wide, 6, 2, "adam")})
    params = sum(p.numel() for p in mlp(wide).parameters())

    meta = {
        "devices": devices, "device_type": xr.device_type(), "torch": torch.__version__,
        "torch_xla": torch_xla.__version__, "python": platform.python_version(), "steps": args.steps,
        "warm_up": args.warm_up, "batch": BATCH, "small": small, "wide": wide, "wide_params": params,
    }
    out = Path(args.out)
    stamped = stamp(tree=os.environ.get("PYTHONPATH") or "the fork installed in the venv")
    write_json(out.with_suffix(".json"), {"meta": meta, "rows": rows, "memory": memory}, stamped)
    md = write_markdown_page(out.with_suffix(".md"), markdown(meta, rows, memory), stamped)
    print(md)
    return 0


def markdown(meta: Dict[str, Any], rows: List[Dict[str, Any]], memory: List[Dict[str, Any]]) -> str:
    lines = [
        "# SPMD: one process, every XLA device of the host",
        "",
        f"{meta['devices']} {meta['device_type']} devices, torch {meta['torch']}, torch_xla {meta['torch_xla']}. "
        f"MLP {'-'.join(map(str, meta['small']))}, global batch {meta['batch']} (sharded over the devices), SGD, "
        f"{meta['steps']} steps, per steady step after {meta['warm_up']}; the loss is read on the host every step "
        "(the Trainer rows log it to the progress bar). Times are medians on a shared machine, for reference only.",
        "",
        "| row | compiles/step | executions/step | transfers/step | ms/step |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['row']} | {r['compiles']:.2f} | {r['executions']:.2f} | {r['transfers']:.2f} | "
                     f"{1000 * r['s_per_step']:.1f} |")
    lines += [
        "",
        f"## Bytes per device: MLP {'-'.join(map(str, meta['wide']))} ({meta['wide_params']:,} parameters), Adam",
        "",
        "Parameters plus optimizer state held by device 0 after the last step (a replicated tensor counts whole, a "
        "sharded one its shard).",
        "",
        "| strategy | MiB per device | share of data parallel |",
        "|---|---|---|",
    ]
    base = memory[0]["bytes_device0"]
    for m in memory:
        lines.append(f"| `{m['strategy']}` | {m['bytes_device0'] / 2 ** 20:.1f} | {m['bytes_device0'] / base:.3f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
