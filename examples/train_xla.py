"""Train a small LightningModule on an XLA device and print what each training step costs.

``PJRT_DEVICE=CPU`` (the default here) gives a real XLA device on the CPU; on a Cloud TPU VM the TPU is used
(``PJRT_DEVICE=TPU``). The per-step counts come from ``torch_xla.debug.metrics``: graphs compiled, graphs executed
and device-to-host transfers, averaged over the steady state (after the warm-up steps). A step's logged values reach
the host on Lightning's copying thread after the step, so at the two ends of the window the counter waits for the
copies of the steps before it (it reads ``trainer.callback_metrics``, which waits for them): the window then holds
every graph and every copy of its own steps, and nothing of the others.

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
    """Reads the XLA counters at the end of every training batch; at the batches in ``edges``, once the copies of
    the steps so far have reached the host."""

    def __init__(self, edges=()):
        self.rows = []
        self.edges = set(edges)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import torch_xla.debug.metrics as met

        if batch_idx in self.edges:
            trainer.callback_metrics  # an exact read: it waits for the copies in flight

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
    counter = StepCounter(edges=(args.warmup - 1, args.steps - 1))
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
    print(reference())


def reference() -> str:
    """One line on what the same counts are for upstream 1.8.6 and Lightning 2.6.6, from the last ``make bench``."""
    import json

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "results", "bench.json")
    try:
        with open(path) as f:
            bench = json.load(f)
        rows = {row["row"]: row["sizes"]["small"]["measure"] for row in bench["rows"]}
        counts = {name: " / ".join(f"{rows[row][k]:.2f}" for k in ("compiles_per_step", "executions_per_step",
                                                                     "transfers_per_step"))
                  for name, row in (("upstream 1.8.6", "before"), ("Lightning 2.6.6", "pl266"))}
    except (OSError, KeyError, ValueError) as err:
        return f"(no reference counts: results/bench.json unreadable: {err!r})"
    return (f"the same model in `make bench` ({bench['meta']['date']}), compilations / executions / transfers per step:"
            f" upstream 1.8.6 {counts['upstream 1.8.6']}, Lightning 2.6.6 {counts['Lightning 2.6.6']};"
            f" 0 / 1 / 1 is the floor: no recompilation, one graph a step, one copy of its values")


if __name__ == "__main__":
    main()
