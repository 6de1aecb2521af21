#!/usr/bin/env python3
"""Plot the MNIST DDP runs of scripts/ddp_evidence.sh: loss curves and replica spread, before and after.

    python scripts/plot_ddp_evidence.py BEFORE_RUN AFTER_RUN --png out.png [--summary out.md]

Each run folder is an ``--out`` of examples/mnist_tpu_ddp.py. The numbers come from its ``losses.csv``; the
TensorBoard event files under ``tb/`` are read as a cross-check when tensorboardX's reader is available.
"""
import argparse
import csv
from pathlib import Path


def read_run(run: Path) -> dict:
    rows = list(csv.DictReader(open(run / "losses.csv")))
    if not rows:
        raise SystemExit(f"{run}/losses.csv has no rows")
    info = {
        "steps": [int(r["step"]) for r in rows],
        "loss": [float(r["loss"]) for r in rows],
        "spread": [float(r["replica_spread"]) for r in rows],
        "replicas": (run / "replicas.txt").read_text().strip() if (run / "replicas.txt").exists() else "?",
        "data": (run / "data.txt").read_text().strip() if (run / "data.txt").exists() else "?",
        "fork": (run / "fork.txt").read_text().split()[0] if (run / "fork.txt").exists() else "?",
    }
    info["tb_points"] = count_tb_points(run / "tb")
    return info


def count_tb_points(tb: Path) -> int:
    """How many train_loss scalars the TensorBoard files hold (-1 when they cannot be read)."""
    import struct

    try:
        from tensorboardX.proto import event_pb2 as pb
    except ImportError:
        return -1

    n = 0
    for path in tb.rglob("events.out.tfevents.*"):
        data = path.read_bytes()
        pos = 0
        # TFRecord framing: u64 length, u32 crc of the length, the record, u32 crc of the record
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos:pos + 8])
            record = data[pos + 12:pos + 12 + length]
            pos += 12 + length + 4
            event = pb.Event()
            event.ParseFromString(record)
            n += sum(1 for v in event.summary.value if v.tag == "train_loss")
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--summary", type=Path)
    args = parser.parse_args()
    runs = {"before the DDP fix": read_run(args.before), "full series": read_run(args.after)}

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_spread) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (label, run), color in zip(runs.items(), ("tab:red", "tab:blue")):
        name = f"{label} ({run['fork']}, {run['replicas']} replicas)"
        ax_loss.plot(run["steps"], run["loss"], color=color, label=name)
        ax_spread.plot(run["steps"], run["spread"], color=color, marker=".", label=name)
    ax_loss.set_xlabel("optimizer step")
    ax_loss.set_ylabel("train loss (replica 0)")
    ax_loss.set_title("MNIST with DDP: loss of replica 0")
    ax_loss.legend(fontsize=8)
    ax_spread.set_xlabel("optimizer step")
    ax_spread.set_ylabel("replica spread of the parameters")
    ax_spread.set_yscale("symlog", linthresh=1e-6)
    ax_spread.set_ylim(bottom=0)
    ax_spread.set_title("0 = every replica holds the same model")
    ax_spread.legend(fontsize=8)
    fig.tight_layout()
    args.png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png, dpi=110)

    lines = ["| run | fork | replicas | data | steps | first loss | last loss | last replica spread | TB points |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, run in runs.items():
        lines.append(f"| {label} | {run['fork']} | {run['replicas']} | {run['data'].split(' (')[0]} | "
                     f"{run['steps'][-1]} | {run['loss'][0]:.4f} | {run['loss'][-1]:.4f} | {run['spread'][-1]:.3g} | "
                     f"{run['tb_points']} |")
    text = "\n".join(lines) + f"\n\nPlot: {args.png}\n"
    if args.summary:
        args.summary.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
