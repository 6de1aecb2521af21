"""A TPU training script as people write it, and what each phase costs on the XLA device.

A LightningDataModule (synthetic, separable data made in this script: no download), a LightningModule with
torchmetrics accuracy in training, validation and test, a StepLR scheduler, ModelCheckpoint, EarlyStopping,
LearningRateMonitor and a CSVLogger, ``precision="bf16"``. It trains, then validates, tests (the best checkpoint)
and predicts, then resumes training from the last checkpoint with ``ckpt_path=`` in a new Trainer.

At the end it prints one JSON object: per phase, graphs compiled / executed / device-to-host transfers per step or
batch (``torch_xla.debug.metrics``), counted between consecutive batches after the first ones (fit: the training
steps of every epoch after the first, leaving out each epoch's first step, which pays for the epoch boundary:
validation, checkpointing, epoch-end metrics), whether the step graph computes in bf16, and what the resumed run
started from.

    PJRT_DEVICE=CPU python examples/tpu_realistic.py [--out DIR] [--epochs 3] [--more-epochs 2] [--json FILE]

``PJRT_DEVICE=CPU`` (the default here) gives a real XLA device on the CPU; on a Cloud TPU VM the TPU is used.
"""
import argparse
import csv
import json
import os
import tempfile

os.environ.setdefault("PJRT_DEVICE", "TPU" if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") else "CPU")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torchmetrics  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint  # noqa: E402
from pytorch_lightning.loggers import CSVLogger  # noqa: E402

FEATURES, CLASSES = 32, 4


class BlobsDataModule(pl.LightningDataModule):
    """Four Gaussian blobs in 32 dimensions, made with a fixed seed: train, validation, test and predict splits."""

    def __init__(self, batch_size: int = 32, train_batches: int = 8, eval_batches: int = 4):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        gen = torch.Generator().manual_seed(1234)
        centers = 0.5 * torch.randn(CLASSES, FEATURES, generator=gen)

        def split(batches):
            n = batches * self.hparams.batch_size
            y = torch.randint(0, CLASSES, (n,), generator=gen)
            x = centers[y] + torch.randn(n, FEATURES, generator=gen)
            return TensorDataset(x, y)

        self.train_set = split(self.hparams.train_batches)
        self.val_set = split(self.hparams.eval_batches)
        self.test_set = split(self.hparams.eval_batches)
        self.predict_set = TensorDataset(split(self.hparams.eval_batches).tensors[0])

    def _loader(self, data, shuffle=False):
        return DataLoader(data, batch_size=self.hparams.batch_size, shuffle=shuffle, drop_last=True)

    def train_dataloader(self):
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self):
        return self._loader(self.val_set)

    def test_dataloader(self):
        return self._loader(self.test_set)

    def predict_dataloader(self):
        return self._loader(self.predict_set)


class Classifier(pl.LightningModule):
    def __init__(self, hidden: int = 64, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(FEATURES, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, CLASSES))
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)
        self.bf16_in_step_graph = None

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        if self.bf16_in_step_graph is None:
            import torch_xla

            # the graph of this step, before it runs: lowering it to HLO text runs nothing
            self.bf16_in_step_graph = "bf16" in torch_xla._XLAC._get_xla_tensors_hlo([loss])
        self.train_acc(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.test_acc(logits, y)
        self.log("test_loss", F.cross_entropy(logits, y))
        self.log("test_acc", self.test_acc)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        (x,) = batch
        return self(x).argmax(dim=-1)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}


def _counts():
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    from pytorch_lightning.utilities.xla_host_transfers import wait_for_host_copies

    # executions are counted when they finish: wait for them (this compiles, executes and transfers nothing), and
    # so are the copies of the logged values to the host, which Lightning makes on another thread
    xm.wait_device_ops()
    wait_for_host_copies()
    return [0 if met.metric_data(n) is None else int(met.metric_data(n)[0])
            for n in ("CompileTime", "ExecuteTime", "TransferFromDeviceTime")]


class GraphCounter(pl.Callback):
    """The XLA counters at the end of every batch, per phase (fit's validation runs are their own phase)."""

    def __init__(self):
        self.marks = {}

    def _mark(self, trainer, phase, batch_idx):
        self.marks.setdefault(phase, []).append((trainer.current_epoch, batch_idx, _counts()))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._mark(trainer, "fit", batch_idx)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._mark(trainer, "fit-validation" if trainer.state.fn == "fit" else "validate", batch_idx)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._mark(trainer, "test", batch_idx)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._mark(trainer, "predict", batch_idx)

    def per_batch(self, phase, first_epoch=0):
        """Counts per batch between consecutive batches of one epoch (run), from ``first_epoch`` on, leaving out the
        first batch of each (it pays for whatever ran before it)."""
        deltas = [[b - a for a, b in zip(m0[2], m1[2])] for m0, m1 in zip(self.marks.get(phase, []),
                                                                            self.marks.get(phase, [])[1:])
                  if m0[0] == m1[0] and m1[1] == m0[1] + 1 and m0[0] >= first_epoch]
        if not deltas:
            return None
        n = len(deltas)
        return {"batches": n, "compiles": sum(d[0] for d in deltas) / n, "executions": sum(d[1] for d in deltas) / n,
                "transfers": sum(d[2] for d in deltas) / n}


class ResumeProbe(pl.Callback):
    """What the resumed run starts from, read when its training starts (after the checkpoint was restored)."""

    def __init__(self):
        self.at_start = None

    def on_train_start(self, trainer, pl_module):
        self.at_start = callback_state(trainer)


def callback_state(trainer):
    es, ck = trainer.early_stopping_callback, trainer.checkpoint_callback
    return {"global_step": int(trainer.global_step), "epoch": int(trainer.current_epoch),
            "early_stopping_wait_count": int(es.wait_count), "early_stopping_best_score": float(es.best_score),
            "checkpoint_best_model_score": None if ck.best_model_score is None else float(ck.best_model_score),
            "checkpoint_best_model_path": os.path.basename(ck.best_model_path or "")}


def make_trainer(out, max_epochs, extra_callbacks):
    callbacks = [
        ModelCheckpoint(dirpath=os.path.join(out, "checkpoints"), monitor="val_loss", mode="min", save_top_k=2,
                        save_last=True),
        EarlyStopping(monitor="val_loss", mode="min", patience=3),
        LearningRateMonitor(logging_interval="epoch"),
        *extra_callbacks,
    ]
    return pl.Trainer(accelerator="tpu", devices=1, precision="bf16", max_epochs=max_epochs, callbacks=callbacks,
                      logger=CSVLogger(out, name="logs"), log_every_n_steps=4, default_root_dir=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="where checkpoints and logs go (default: a temporary directory)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--more-epochs", type=int, default=2, help="epochs the resumed run adds")
    parser.add_argument("--json", default=None, help="also write the report to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tpu-realistic-") as tmp:
        report = run(args.out or tmp, args.epochs, args.more_epochs)
    text = json.dumps(report, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    return report


def run(out, epochs, more_epochs):
    pl.seed_everything(0)
    dm = BlobsDataModule()
    model = Classifier()
    counter = GraphCounter()
    trainer = make_trainer(out, epochs, [counter])
    trainer.fit(model, datamodule=dm)
    saved = callback_state(trainer)
    after_fit = {k: float(v) for k, v in trainer.callback_metrics.items()}
    val = trainer.validate(model, datamodule=dm, verbose=False)
    test = trainer.test(datamodule=dm, ckpt_path="best", verbose=False)
    predictions = trainer.predict(model, datamodule=dm)
    predicted = torch.cat([p.cpu() for p in predictions])

    # resume: a new process would do the same with a new model and a new Trainer
    last = os.path.join(out, "checkpoints", "last.ckpt")
    probe = ResumeProbe()
    resumed = make_trainer(out, epochs + more_epochs, [probe])
    resumed.fit(Classifier(), datamodule=dm, ckpt_path=last)

    # what LearningRateMonitor wrote through the logger, one value per epoch
    with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
        lrs = [float(row["lr-SGD"]) for row in csv.DictReader(f) if row.get("lr-SGD")]
    return {
        "lightning": pl.__version__,
        "device": os.environ.get("PJRT_DEVICE"),
        "precision": str(trainer.precision),
        "bf16_in_step_graph": model.bf16_in_step_graph,
        "fit": counter.per_batch("fit", first_epoch=1),
        "fit_validation": counter.per_batch("fit-validation", first_epoch=1),
        "validate": counter.per_batch("validate"),
        "test": counter.per_batch("test"),
        "predict": counter.per_batch("predict"),
        "metrics": {"val_acc": float(val[0]["val_acc"]), "val_loss": float(val[0]["val_loss"]),
                    "test_acc": float(test[0]["test_acc"]), "lr_logged": lrs,
                    "train_acc_epoch": after_fit.get("train_acc_epoch")},
        "predict_batches": len(predictions),
        "predict_shape": list(predicted.shape),
        "early_stopped": bool(trainer.early_stopping_callback.stopped_epoch),
        "resume": {"saved": saved, "at_start": probe.at_start, "end": callback_state(resumed),
                   "ckpt_path": os.path.basename(last)},
        "checkpoints": sorted(os.listdir(os.path.join(out, "checkpoints"))),
        "csv_logs": sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(os.path.join(out, "logs"))
                           for f in fs if f.endswith(".csv")),
    }


if __name__ == "__main__":
    main()
