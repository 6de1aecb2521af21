"""Train a small LightningModule on an XLA device and print what each training step costs.

``PJRT_DEVICE=CPU`` (the default here) gives a real XLA device on the CPU; on a Cloud TPU VM the TPU is used
(``PJRT_DEVICE=TPU``). The per-step counts come from ``torch_xla.debug.metrics``: graphs compiled, graphs executed
and device-to-host transfers, averaged over the steady state (after the warm-up steps).

    python examples/train_xla.py [--steps 60] [--warmup 20]
"""
import argparse
import os
import time

os.environ.setdefault("PJRT_DEVICE", "TPU" if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") else "CPU")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402


class MLP(pl.LightningModule):
    """64-128-10 MLP on synthetic data; logs its loss on the progress bar every step, as users do."""

    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class StepCounter(pl.Callback):
    """Reads the XLA counters at the end of every training batch."""

    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import torch_xla.debug.metrics as met

        def count(name):
            data = met.metric_data(name)
            return 0 if data is None else int(data[0])

        self.rows.append((time.perf_counter(), count("CompileTime"), count("ExecuteTime"),
                          count("TransferFromDeviceTime")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if args.steps <= args.warmup + 1:
        parser.error("--steps must exceed --warmup by at least 2")

    pl.seed_everything(0)
    n = args.steps * args.batch_size
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=args.batch_size, drop_last=True)
    counter = StepCounter()
    trainer = pl.Trainer(accelerator="tpu", devices=1, max_steps=args.steps, callbacks=[counter], logger=False,
                         enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(MLP(), loader)

    first, last = counter.rows[args.warmup - 1], counter.rows[-1]
    steps = len(counter.rows) - args.warmup
    print(f"\npytorch_lightning {pl.__version__} on XLA ({os.environ['PJRT_DEVICE']}), "
          f"steady state = steps {args.warmup}..{len(counter.rows)}")
    print(f"compilations/step: {(last[1] - first[1]) / steps:.2f}")
    print(f"executions/step:   {(last[2] - first[2]) / steps:.2f}")
    print(f"transfers/step:    {(last[3] - first[3]) / steps:.2f}")
    print(f"seconds/step:      {(last[0] - first[0]) / steps:.4f}")


if __name__ == "__main__":
    main()
