"""Train an MNIST classifier with DDP on every TPU core of this host, and record whether the replicas agree.

    python examples/mnist_tpu_ddp.py [--devices auto] [--max-steps 300] [--out build/mnist_ddp]

Data: torchvision's MNIST when torchvision is installed and the data set can be downloaded (or is already in
``--data-dir``); otherwise, or with ``--synthetic``, a deterministic stand-in of the same shape: 1x28x28
images in 10 classes, each class a fixed random stroke pattern plus noise, so the loss can fall.

Output in ``--out``:
    losses.csv   step, train loss of replica 0, replica spread (written by global rank 0)
    tb/          TensorBoard event files (TensorBoardLogger): train_loss every step, replica_spread
    data.txt     which data set was used and why
    replicas.txt the number of replicas (world size)
    fork.txt     the pytorch_lightning version and where it was imported from

The replica spread is the largest difference, over all replicas, of a fingerprint of the parameters (the
sum and the sum of absolute values of every tensor). DDP keeps the replicas identical, so it stays 0; when
the gradients are not all-reduced each replica follows its own data and the spread grows. With one device
it is 0 by definition (no collective is run, as collectives hang on XLA:CPU).

``PJRT_DEVICE`` defaults to TPU on a TPU VM and to CPU elsewhere (a real XLA device on the CPU, one device:
``--devices 1``), which is how the test suite smoke-tests this script.
"""
import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "TPU" if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") else "CPU")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.loggers import TensorBoardLogger  # noqa: E402

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


def synthetic_mnist(n: int, seed: int = 0) -> TensorDataset:
    """``n`` deterministic MNIST-shaped samples: class prototypes made of a few strokes, plus pixel noise."""
    g = torch.Generator().manual_seed(seed)
    prototypes = torch.zeros(10, 1, 28, 28)
    for c in range(10):
        for _ in range(4):  # four random horizontal or vertical strokes per class
            pos = int(torch.randint(4, 24, (1,), generator=g))
            lo, hi = sorted(int(v) for v in torch.randint(2, 26, (2,), generator=g))
            hi = max(hi, lo + 6)
            if torch.rand(1, generator=g) < 0.5:
                prototypes[c, 0, pos - 1:pos + 2, lo:hi] = 1.0
            else:
                prototypes[c, 0, lo:hi, pos - 1:pos + 2] = 1.0
    labels = torch.randint(0, 10, (n,), generator=g)
    images = prototypes[labels] + 0.3 * torch.randn(n, 1, 28, 28, generator=g)
    images = (images.clamp(0, 1) - MNIST_MEAN) / MNIST_STD
    return TensorDataset(images, labels)


def load_data(data_dir: Path, synthetic: bool, n_synthetic: int):
    """(dataset, description). Real MNIST when possible, the synthetic stand-in otherwise."""
    if synthetic:
        return synthetic_mnist(n_synthetic), "synthetic (--synthetic)"
    try:
        from torchvision import datasets, transforms
    except ImportError:
        return synthetic_mnist(n_synthetic), "synthetic (torchvision is not installed)"
    try:
        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))])
        return datasets.MNIST(str(data_dir), train=True, download=True, transform=tf), f"torchvision MNIST in {data_dir}"
    except Exception as err:  # no network, a mirror down, a corrupt file
        return synthetic_mnist(n_synthetic), f"synthetic (MNIST could not be loaded: {type(err).__name__}: {err})"


def make_net(arch: str) -> torch.nn.Module:
    if arch == "cnn":
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),  # 16x13x13
            torch.nn.Conv2d(16, 32, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2),  # 32x5x5
            torch.nn.Flatten(), torch.nn.Linear(32 * 5 * 5, 10),
        )
    # an MLP: the same task, much cheaper to compile on XLA:CPU (the smoke test uses it)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


class MNISTClassifier(pl.LightningModule):
    def __init__(self, lr: float, arch: str = "cnn"):
        super().__init__()
        self.save_hyperparameters()
        self.net = make_net(arch)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def fingerprint(module: torch.nn.Module) -> torch.Tensor:
    """Two numbers per parameter tensor: its sum and its sum of absolute values."""
    parts = []
    for p in module.parameters():
        parts.append(p.detach().sum().reshape(1))
        parts.append(p.detach().abs().sum().reshape(1))
    return torch.cat(parts).float()


class Recorder(pl.Callback):
    """Every ``every`` steps: replica 0's loss and the spread of the parameter fingerprints over replicas."""

    def __init__(self, csv_path: Path, every: int):
        self.csv_path = csv_path
        self.every = every
        self.rows = []

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero:
            (self.csv_path.parent / "replicas.txt").write_text(f"{trainer.world_size}\n")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step  # optimizer steps taken so far
        if step % self.every and step != trainer.max_steps:
            return
        if trainer.world_size > 1:  # a collective: every replica takes part
            gathered = trainer.strategy.all_gather(fingerprint(pl_module)).reshape(trainer.world_size, -1)
            spread = float((gathered.max(0).values - gathered.min(0).values).max())
        else:
            spread = 0.0
        loss = float(outputs["loss"].detach())
        if trainer.is_global_zero:
            self.rows.append((step, loss, spread))
            with open(self.csv_path, "a", newline="") as f:
                csv.writer(f).writerow([step, f"{loss:.6g}", f"{spread:.6g}"])
            if trainer.logger is not None:
                trainer.logger.log_metrics({"replica_spread": spread}, step=step)


def parse_devices(text: str):
    return text if text == "auto" else int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=parse_devices, default="auto", help='"auto" = every TPU core of this host')
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--arch", choices=("cnn", "mlp"), default="cnn")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--synthetic", action="store_true", help="use the synthetic stand-in, do not download")
    parser.add_argument("--synthetic-size", type=int, default=8192)
    parser.add_argument("--data-dir", type=Path, default=Path("build/data"))
    parser.add_argument("--out", type=Path, default=Path("build/mnist_ddp"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "losses.csv"
    csv_path.write_text("step,loss,replica_spread\n")
    pl.seed_everything(args.seed)
    dataset, source = load_data(args.data_dir, args.synthetic, args.synthetic_size)
    (args.out / "data.txt").write_text(source + "\n")
    (args.out / "fork.txt").write_text(f"{pl.__version__} {Path(pl.__file__).parent}\n")
    print(f"data: {source}")
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)

    recorder = Recorder(csv_path, args.log_every)
    trainer = pl.Trainer(
        accelerator="tpu", devices=args.devices, max_steps=args.max_steps,
        logger=TensorBoardLogger(str(args.out), name="tb", version=0), log_every_n_steps=1,
        callbacks=[recorder], enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
        default_root_dir=str(args.out),
    )
    start = time.perf_counter()
    trainer.fit(MNISTClassifier(args.lr, args.arch), loader)
    # with spawned replicas the rows were written by the child of global rank 0; this process reads them back
    rows = list(csv.DictReader(open(csv_path)))
    if not rows:
        print("no loss was recorded", file=sys.stderr)
        return 1
    replicas = (args.out / "replicas.txt").read_text().strip()
    last = rows[-1]
    print(f"pytorch_lightning {pl.__version__}, {replicas} replica(s), {len(rows)} records, "
          f"{time.perf_counter() - start:.1f} s; last step {last['step']}: loss {last['loss']}, "
          f"replica spread {last['replica_spread']}")
    if not all(math.isfinite(float(r["loss"])) for r in rows):
        print("a recorded loss is not finite", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
