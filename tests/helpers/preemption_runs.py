"""Training runs that a real ``SIGTERM`` interrupts, as a spot TPU VM's shutdown does, and the runs that resume them.

``python -m helpers.preemption_runs CONFIG_JSON`` trains in its own interpreter. The config says the strategy
(``"single"``: one XLA device; ``"xla_spmd"`` / ``"xla_spmd_fsdp"``: every XLA device of the process), where the
checkpoints go, at which global step a ``SIGTERM`` is sent and to which process (``"self"``, or the launcher's main
process ``"main"``), and whether to resume with ``ckpt_path="last"``. The process writes ``report.json`` in its
``out`` folder: the final weights, the global step and epoch it ended at, the rows of every batch it trained on with
the global step each led to, the logger steps, and the graph counts of the steady steps.

The model has dropout, the data loader shuffles and the optimizer has momentum and a learning-rate schedule: a
resume that loses a random state, a batch or a piece of the optimizer's state does not end at the same weights.

``"kill_at_step"`` kills the process with ``SIGKILL`` at that global step instead (a crash without notice);
``"every_n_train_steps"`` and ``"epochs"`` set the ``ModelCheckpoint`` trigger and the length of the run, and
``"ckpt_path"`` the checkpoint to resume from; ``"slow_fsync_of"`` holds the ``fsync`` of a checkpoint file whose name
holds it, and a kill waits until that ``fsync`` has begun (the kill meets its write halfway, however busy the host);
``"background_writes": false`` writes each checkpoint before its save returns; ``"kill_after_writes": true`` lets
the writes in flight land before the kill (the resume from that checkpoint is then what is tested, not how far its
write got on a loaded host).

``"augment": true`` gives the training dataloader random augmentations drawn from torch's, NumPy's and Python's
global generators in ``__getitem__`` (noise on the features), ``num_workers`` and the strategy's ``batches_ahead``
from the config, one epoch of 12 batches, and a training step that draws from the same generators on the training
thread (recorded, as ``draws``); ``"seed_by_rank": true`` seeds each process with ``3 + global_rank`` as it sets up.

Where the checkpoints are written from: ``"every_n_epochs"`` and ``"save_on_train_epoch_end"`` go to
``ModelCheckpoint``, ``"val_check_interval"`` (0.5 unless set) and ``"limit_val_batches"`` to the Trainer (with
``val_check_interval`` 1.0 or no validation, ``ModelCheckpoint`` saves in ``on_train_epoch_end``).
``"user_save": {"hook": ..., "step": ...}`` adds a callback of the user's that calls ``trainer.save_checkpoint`` into
``dirpath/own.ckpt`` in that hook, the first time it runs at or after that global step; ``"early_stopping": true`` puts an
``EarlyStopping`` on ``val_loss`` before it.
``"loader": "two"`` trains on a dict of two shuffling loaders (a batch from each), ``"loader": "iterable"`` on
an ``IterableDataset`` that draws its order as each pass starts; ``"max_time"`` (``"DD:HH:MM:SS"``) sets the Trainer's.
``"stateful": true`` gives the module and a callback state that they keep in their own hooks, as an EMA of the
weights or a metric accumulated by hand does: the module sums its weights into a buffer in its ``on_train_batch_end``
and the losses of the epoch in ``training_epoch_end``; the callback (after ``ModelCheckpoint``) counts batches and
sums the logged loss in ``on_train_batch_end`` and ``on_train_epoch_end``, and saves both in its ``state_dict()``.
Both are reported (``module_state``, ``callback_state``). ``"train_time_interval"`` (seconds) saves on
``ModelCheckpoint``'s clock, which here advances one second per training batch (a stand-in for the wall clock, so that
the batches it saves after do not depend on this host's speed).
"""
import json
import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List

import torch
import torch.nn.functional as F

import pytorch_lightning as pl

ROWS = 96
BATCH = 8  # 12 batches per epoch
FEATURES = 12
CLASSES = 4
EPOCHS = 2
AFTER_FIT = "@@after fit@@"


def _dataset() -> Any:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(ROWS, FEATURES, generator=g)
    y = torch.randint(0, CLASSES, (ROWS,), generator=g)
    index = torch.arange(ROWS)
    return torch.utils.data.TensorDataset(x, y, index)


class AugmentedDataset(torch.utils.data.Dataset):
    """The rows of ``_dataset()`` with noise from torch's, NumPy's and Python's global generators: a random
    augmentation drawn on whichever thread or worker loads the row."""

    def __init__(self) -> None:
        self.rows = _dataset()

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Any:
        import numpy as np

        x, y, index = self.rows[i]
        noise = 0.1 * torch.randn(FEATURES) + float(np.random.normal(0.0, 0.1)) + random.gauss(0.0, 0.1)
        return x + noise, y, index


class AugmentedStream(torch.utils.data.IterableDataset):
    """The rows of :class:`AugmentedDataset` as a stream (a loader that knows no length): each pass draws its order
    from torch's global generator as it starts, and each row its noise."""

    def __init__(self) -> None:
        self.rows = AugmentedDataset()

    def __iter__(self) -> Any:
        for i in torch.randperm(len(self.rows)).tolist():
            yield self.rows[i]


class Module(pl.LightningModule):
    def __init__(self, config: Any = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, CLASSES)
        )
        self.pending_rows: List[torch.Tensor] = []
        self.pending_inputs: List[torch.Tensor] = []
        self.config = config or {}
        # what the training thread drew from the global generators, a triple per step (`augment`)
        self.draws: List[List[float]] = []

    def setup(self, stage: str) -> None:
        if self.config.get("seed_by_rank"):
            # in each process, as it sets up: processes of one run seeded differently
            pl.seed_everything(3 + self.trainer.global_rank)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.config.get("augment"):
            import numpy as np

            self.draws.append([float(torch.rand(())), float(np.random.rand()), random.random()])

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if isinstance(batch, dict):
            # two training loaders: a batch of each
            x, y, index = (torch.cat(parts) for parts in zip(batch["a"], batch["b"]))
        else:
            x, y, index = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        # the rows of each batch, read at the end of the run so that reading them costs no transfer of its own
        self.pending_rows.append(index)
        if self.config.get("augment"):
            # the noise each row got
            self.pending_inputs.append(x.detach().sum(dim=1))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y, _ = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def train_dataloader(self) -> Any:
        loader = self.config.get("loader")
        if loader == "two":
            return {
                "a": torch.utils.data.DataLoader(AugmentedDataset(), batch_size=BATCH, shuffle=True),
                "b": torch.utils.data.DataLoader(AugmentedDataset(), batch_size=BATCH, shuffle=True),
            }
        if loader == "iterable":
            return torch.utils.data.DataLoader(AugmentedStream(), batch_size=BATCH)
        if self.config.get("augment"):
            return torch.utils.data.DataLoader(
                AugmentedDataset(), batch_size=BATCH, shuffle=True, num_workers=self.config.get("num_workers", 0)
            )
        return torch.utils.data.DataLoader(_dataset(), batch_size=BATCH, shuffle=True)

    def val_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(_dataset(), batch_size=32)


class StatefulModule(Module):
    """Keeps state in its own hooks: a running sum of the weights after each batch (as an EMA of the weights does),
    and of the losses of each epoch's batches with their count (``training_epoch_end``'s outputs)."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.register_buffer("weight_sum", torch.zeros(CLASSES, 32))
        self.register_buffer("epoch_losses", torch.zeros(()))

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.weight_sum += self.net[3].weight.detach()

    def training_epoch_end(self, outputs: Any) -> None:
        # every batch's output of the epoch, those trained before a resume included
        self.epoch_losses += torch.stack([o["loss"] for o in outputs]).sum() + len(outputs)


class ManualModule(Module):
    """Manual optimization with two optimizers, as a GAN trains, and a torchmetrics metric logged every step."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.automatic_optimization = False
        self.head = torch.nn.Linear(CLASSES, CLASSES)
        self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES, average="micro")

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y, index = batch
        body_opt, head_opt = self.optimizers()
        logits = self.head(self.net(x))
        loss = F.cross_entropy(logits, y)
        body_opt.zero_grad()
        head_opt.zero_grad()
        self.manual_backward(loss)
        body_opt.step()
        head_opt.step()
        self.accuracy(logits, y)
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_acc", self.accuracy)
        self.pending_rows.append(index)

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9),
            torch.optim.Adam(self.head.parameters(), lr=0.01),
        ]


class StatefulCallback(pl.Callback):
    """Keeps state in its own hooks, after ``ModelCheckpoint``'s: batches seen, and sums of the batches' losses and of
    the epochs' ends, saved in its ``state_dict()``."""

    def __init__(self) -> None:
        self.batches = 0
        self.loss_sum = 0.0
        self.epoch_ends = 0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1
        self.loss_sum += float(outputs["loss"]) if self.batches % 4 == 0 else 0.0

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.epoch_ends += 1
        self.loss_sum *= 0.5

    def state_dict(self) -> Dict[str, Any]:
        return {"batches": self.batches, "loss_sum": self.loss_sum, "epoch_ends": self.epoch_ends}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.batches, self.loss_sum = state_dict["batches"], state_dict["loss_sum"]
        self.epoch_ends = state_dict["epoch_ends"]


def _finish_checkpoint_writes(trainer: Any) -> None:
    """Wait for the checkpoint writes in flight, also on a series before ``finish_checkpoint_writes`` (the resume
    matrix run on an older tree, to measure how it resumed)."""
    try:
        from pytorch_lightning.trainer.connectors.xla_preemption import finish_checkpoint_writes
    except ImportError:
        getattr(trainer.strategy.checkpoint_io, "wait_for_writes", lambda: None)()
    else:
        finish_checkpoint_writes(trainer)


def user_save(hook: str, step: int, dirpath: str) -> pl.Callback:
    """A callback of the user's: ``trainer.save_checkpoint(<dirpath>/own.ckpt)`` in the first call of ``hook`` at or
    after global step ``step`` (outside the sanity check)."""
    path = os.path.join(dirpath, "own.ckpt")

    def save(self: pl.Callback, trainer: Any, *args: Any) -> None:
        if not trainer.sanity_checking and trainer.global_step >= step and not os.path.exists(path):
            trainer.save_checkpoint(path)

    return type("UserSave", (pl.Callback,), {hook: save})()


class _BatchClock:
    """``ModelCheckpoint``'s clock for ``train_time_interval``: one second per training batch."""

    now = 0.0

    @classmethod
    def install(cls) -> None:
        import time
        import types

        from pytorch_lightning.callbacks import model_checkpoint

        clock = types.SimpleNamespace(**{name: getattr(time, name) for name in dir(time) if not name.startswith("_")})
        clock.monotonic = lambda: cls.now
        model_checkpoint.time = clock


class Recorder(pl.Callback):
    """Records every training step, sends the ``SIGTERM`` the config asks for, and writes ``report-rank{R}.json``
    when the run ends or is preempted."""

    def __init__(self, config: Dict[str, Any]) -> None:
        self.config = config
        self.steps: List[Dict[str, Any]] = []
        # the validation batches run inside fit: [global step, batch index]
        self.val_batches: List[List[int]] = []
        self.signalled = False

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        _BatchClock.now += 1.0

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        from helpers.xla_metrics import XLACounters

        self.steps.append(
            {
                "global_step": trainer.global_step,
                "epoch": trainer.current_epoch,
                "batch_idx": batch_idx,
                "logger_step": trainer.fit_loop.epoch_loop._batches_that_stepped,
                "bar": trainer.progress_bar_callback.train_batch_idx,
                "compiles": XLACounters.get("CompileTime"),
                # SPMD runs count as `ExecuteReplicatedTime`
                "executions": XLACounters.get("ExecuteTime") + XLACounters.get("ExecuteReplicatedTime"),
                "transfers": XLACounters.get("TransferFromDeviceTime"),
            }
        )
        config = self.config
        if trainer.global_step == config.get("kill_at_step"):
            # a crash without notice (a host failure, an OOM kill): nothing of this step's end runs, no checkpoint of
            # this step is written (`ModelCheckpoint` comes after this callback)
            if config.get("kill_after_writes"):
                _finish_checkpoint_writes(trainer)
            if config.get("slow_fsync_of") and not _FSYNC_HELD.wait(120):
                # the writer thread had not reached the held `fsync`: the kill would not meet the write halfway
                raise RuntimeError(f"the fsync of {config['slow_fsync_of']!r} did not begin within 120 s")
            os.kill(os.getpid(), signal.SIGKILL)
        due = trainer.global_step == config.get("signal_at_step") or len(self.steps) == config.get("signal_at_batch")
        if due and trainer.global_rank == config.get("signal_rank", 0) and not self.signalled:
            self.signalled = True
            target = config.get("signal_to", "self")
            if target == "group":
                os.killpg(os.getpgid(0), signal.SIGTERM)
            else:
                os.kill(os.getppid() if target == "main" else os.getpid(), signal.SIGTERM)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        if trainer.sanity_checking:
            return
        self.val_batches.append([trainer.global_step, batch_idx])
        # `signal_in_validation`: [global step, validation batch index]
        due = [trainer.global_step, batch_idx] == self.config.get("signal_in_validation")
        if due and trainer.global_rank == self.config.get("signal_rank", 0) and not self.signalled:
            self.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._report(trainer, pl_module, "finished")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._report(trainer, pl_module, type(exception).__name__)

    def _report(self, trainer: Any, pl_module: Any, status: str) -> None:
        rows = [t.cpu().tolist() for t in pl_module.pending_rows]
        for step, batch_rows in zip(self.steps, rows):
            step["rows"] = batch_rows
        for step, inputs in zip(self.steps, getattr(pl_module, "pending_inputs", [])):
            step["inputs"] = inputs.cpu().double().tolist()
        weights = {k: v.detach().cpu().double().tolist() for k, v in pl_module.net.state_dict().items()}
        ckpt = trainer.checkpoint_callback
        report = {
            "status": status,
            "steps": self.steps,
            "val_batches": self.val_batches,
            "weights": weights,
            "global_step": trainer.global_step,
            "top_k": sorted(os.path.basename(p) for p in ckpt.best_k_models),
            "rng_after": float(torch.rand(())),
            "draws": pl_module.draws,
        }
        if self.config.get("stateful"):
            report["module_state"] = {
                "weight_sum": pl_module.weight_sum.cpu().double().tolist(),
                "epoch_losses": float(pl_module.epoch_losses.cpu()),
            }
            stateful = [c for c in trainer.callbacks if isinstance(c, StatefulCallback)]
            report["callback_state"] = stateful[0].state_dict()
        Path(self.config["out"], f"report-rank{trainer.global_rank}.json").write_text(json.dumps(report))


_FSYNC_HELD = threading.Event()


def _slow_fsync_of(name: str) -> None:
    """Hold the ``fsync`` of a file whose name holds ``name`` for a minute: its bytes are written, not yet in
    place, when the process is killed. ``_FSYNC_HELD`` is set once the held ``fsync`` has begun."""
    import time

    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if name in os.readlink(f"/proc/self/fd/{fd}"):
            _FSYNC_HELD.set()
            time.sleep(60)
        real_fsync(fd)

    os.fsync = fsync


def main(config: Dict[str, Any]) -> None:
    # a runner started in the background has SIGINT ignored, and children inherit it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if config.get("slow_fsync_of"):
        _slow_fsync_of(config["slow_fsync_of"])
    if config.get("background_writes") is False:
        # each checkpoint on disk when its save returns: a kill right after a save finds it
        os.environ["PL_XLA_BACKGROUND_CHECKPOINT_WRITES"] = "0"
    import contextlib

    from pytorch_lightning.callbacks import ModelCheckpoint

    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    strategy = config.get("strategy", "single")
    host: Any = contextlib.nullcontext()
    kwargs: Dict[str, Any] = {"accelerator": "tpu", "devices": 1}
    # the strategy's own options: `batches_ahead` where the config names it
    options = {"batches_ahead": config["batches_ahead"]} if "batches_ahead" in config else {}
    if strategy == "tpu_spawn":
        from helpers.gloo_xla_collectives import simulated_tpu_host
        from pytorch_lightning.strategies import TPUSpawnStrategy

        host = simulated_tpu_host(2, out / "harness", timeout=60.0, deadline=240.0)
        kwargs = {"accelerator": "tpu", "devices": "auto"}
        if options:
            kwargs["strategy"] = TPUSpawnStrategy(**options)
    elif config.get("sharded") or (options and strategy != "single"):
        from pytorch_lightning.strategies import XLASPMDFSDPStrategy, XLASPMDStrategy

        cls = XLASPMDFSDPStrategy if strategy == "xla_spmd_fsdp" else XLASPMDStrategy
        if config.get("sharded"):
            options["state_dict_type"] = "sharded"
        kwargs = {"accelerator": "tpu", "strategy": cls(**options)}
    elif strategy != "single":
        kwargs = {"accelerator": "tpu", "strategy": strategy}
    elif options:
        from pytorch_lightning.strategies import SingleTPUStrategy

        kwargs = {"accelerator": "tpu", "devices": 1, "strategy": SingleTPUStrategy(device=0, **options)}
    with host:
        pl.seed_everything(3)
        interval = None
        if config.get("train_time_interval") is not None:
            import datetime

            _BatchClock.install()
            interval = datetime.timedelta(seconds=config["train_time_interval"])
        model = ManualModule() if config.get("manual") else StatefulModule(config) if config.get("stateful") else Module(
            config)
        checkpoint = ModelCheckpoint(dirpath=config["dirpath"], save_last=True, save_top_k=-1,
                                     every_n_train_steps=config.get("every_n_train_steps"),
                                     every_n_epochs=config.get("every_n_epochs"),
                                     train_time_interval=interval,
                                     save_on_train_epoch_end=config.get("save_on_train_epoch_end"))
        callbacks: List[pl.Callback] = [checkpoint, Recorder(config)]
        if config.get("early_stopping"):
            # a callback that keeps state in its `on_validation_end`, before the user's save
            callbacks.append(pl.callbacks.EarlyStopping(monitor="val_loss", patience=100))
        if config.get("user_save"):
            # before the stateful callback: what that one does in the same hook comes after the save
            callbacks.append(user_save(config["user_save"]["hook"], config["user_save"]["step"], config["dirpath"]))
        if config.get("stateful"):
            callbacks.append(StatefulCallback())
        validation: Dict[str, Any] = {"val_check_interval": config.get("val_check_interval", 0.5)}
        if "limit_val_batches" in config:
            validation["limit_val_batches"] = config["limit_val_batches"]
        if config.get("max_time"):
            # a time limit far off: its `Timer` callback keeps the elapsed time in every checkpoint
            validation["max_time"] = config["max_time"]
        trainer = pl.Trainer(
            max_epochs=config.get("epochs", 1 if config.get("augment") else EPOCHS),
            callbacks=callbacks,
            logger=pl.loggers.CSVLogger(config["logs"], name="run", version=0),
            default_root_dir=str(out),
            enable_progress_bar=True,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            log_every_n_steps=1,
            accumulate_grad_batches=config.get("accumulate", 1),
            **validation,
            **kwargs,
        )
        ckpt_path = config.get("ckpt_path") or ("last" if config.get("resume") else None)
        trainer.fit(model, ckpt_path=ckpt_path)
    # only a run that was not preempted gets here: after a preemption, `fit` ends the process
    print(AFTER_FIT, flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))


def flat_weights(weights: Dict[str, List]) -> List[float]:
    """Every number of a report's ``weights`` (parameter name -> nested lists), in one list, parameters by name."""
    values: List[float] = []
    for key in sorted(weights):
        stack = [weights[key]]
        while stack:
            item = stack.pop()
            if isinstance(item, list):
                stack.extend(item)
            else:
                values.append(item)
    return values


def weights_diff(first: Dict[str, List], second: Dict[str, List]) -> float:
    """The largest absolute difference between two reports' ``weights``."""
    return max(abs(a - b) for a, b in zip(flat_weights(first), flat_weights(second)))
