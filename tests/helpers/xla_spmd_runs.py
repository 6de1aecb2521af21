"""Training runs for the SPMD tests, each meant for a fresh process (``helpers.xla_subprocess.run_python``).

``trainer_runs(strategy)`` trains the same small model the same way on one XLA device (``strategy=None``) or with an
SPMD strategy on every device of the process, and returns for each scenario what the tests compare: the weights, the
validation loss, the XLA counters of the steady-state steps, the sharding of every parameter and the size of its
shard on each device. The same global batches reach every run (the dataloader's batch is the host's global batch).
"""
import glob
import os
import re
from typing import Any, Dict, List, Optional

import torch

BATCH = 16
STEPS = 12
WARM_UP = 6
VAL_BATCHES = 4
CLIP = 0.05


def _data(n: int, seed: int) -> List:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    return list(zip(x, y))


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def counters() -> Dict[str, int]:
    """Compilations, graph executions (SPMD runs count as ``ExecuteReplicatedTime``) and device-to-host transfers."""
    from helpers.xla_metrics import XLACounters

    return {
        "compiles": XLACounters.get("CompileTime"),
        "executions": XLACounters.get("ExecuteTime") + XLACounters.get("ExecuteReplicatedTime"),
        "transfers": XLACounters.get("TransferFromDeviceTime"),
    }


def sharding(module: torch.nn.Module) -> Dict[str, Any]:
    """Each parameter's sharding spec and the shapes of its shards on the devices."""
    import torch_xla

    out = {}
    for name, param in module.named_parameters():
        spec = torch_xla._XLAC._get_xla_sharding_spec(param)
        shards = torch_xla._XLAC._get_local_shards([param])[0] if spec else [(param.detach().cpu(), "")]
        out[name.replace("_orig_module.", "")] = {
            "spec": spec,
            "shape": list(param.shape),
            "shards": [list(t.shape) for t, _ in shards],
        }
    return out


def _module(scenario: str, record: Dict[str, Any]):
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()
            self.automatic_optimization = scenario != "manual"

        def training_step(self, batch, batch_idx):
            x, y = batch
            if self.automatic_optimization:
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                self.log("loss", loss, prog_bar=True)
                return loss
            for opt in self.optimizers():
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                opt.zero_grad()
                self.manual_backward(loss)
                self.clip_gradients(opt, gradient_clip_val=CLIP, gradient_clip_algorithm="norm")
                opt.step()
            self.log("loss", loss, prog_bar=True)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            if scenario == "manual":
                return [
                    torch.optim.SGD(self.net[0].parameters(), lr=0.5, momentum=0.9),
                    torch.optim.Adam(self.net[2].parameters(), lr=0.01),
                ]
            return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(_data(BATCH * STEPS, 0), batch_size=BATCH)

        def val_dataloader(self):
            return torch.utils.data.DataLoader(_data(BATCH * VAL_BATCHES, 1), batch_size=BATCH)

    return Model()


def _counting_callback(record: Dict[str, Any]):
    from pytorch_lightning import Callback

    class Count(Callback):
        def on_train_start(self, trainer, pl_module):
            # what a resumed run's ModelCheckpoint got back from the checkpoint
            record["restored_best_model_path"] = trainer.checkpoint_callback.best_model_path

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == WARM_UP:
                record["train_start"] = counters()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == STEPS - 1:
                end = counters()
                record["train"] = {k: (end[k] - record["train_start"][k]) / (STEPS - WARM_UP) for k in end}
                record["sharding"] = sharding(pl_module)
                record["wrapped"] = [n for n, m in pl_module.named_modules()
                                     if type(m).__name__ == "SpmdFullyShardedDataParallel"]
                record["optimizer_state"] = _optimizer_state_sharding(trainer.optimizers)
                states = [v for opt in trainer.optimizers for st in opt.state.values() for v in st.values()
                          if isinstance(v, torch.Tensor) and v.device.type == "xla" and v.dim()]
                record["bytes_device0"] = bytes_on_device(list(pl_module.parameters()) + states)

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if not trainer.sanity_checking and batch_idx == 1:
                record["val_start"] = counters()

        def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if not trainer.sanity_checking and batch_idx == VAL_BATCHES - 1:
                end = counters()
                record["val"] = {k: (end[k] - record["val_start"][k]) / (VAL_BATCHES - 1) for k in end}

    return Count()


def _optimizer_state_sharding(optimizers) -> List[Dict[str, Any]]:
    """For every tensor of the optimizers' state: its key, its sharding and that of its parameter."""
    import torch_xla

    spec = torch_xla._XLAC._get_xla_sharding_spec
    out = []
    for opt in optimizers:
        for param, state in opt.state.items():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type == "xla" and value.dim():
                    out.append({"key": key, "spec": spec(value), "param_spec": spec(param)})
    return out


def bytes_on_device(tensors, device: int = 0) -> int:
    """Bytes that ``tensors`` occupy on XLA device ``device`` (a replicated tensor whole, a sharded one its shard)."""
    import torch_xla

    total = 0
    for t in tensors:
        if torch_xla._XLAC._get_xla_sharding_spec(t):
            shard = torch_xla._XLAC._get_local_shards([t])[0][device][0]
        else:
            shard = t
        total += shard.numel() * shard.element_size()
    return total


def trainer_run(scenario: str, strategy: Optional[str], tmp_dir: str, resume_from: Optional[str] = None,
                save_top_k: int = 2, mode: str = "min") -> Dict[str, Any]:
    """One fit of ``scenario`` ("clip": automatic optimization with ``gradient_clip_val``; "accumulate": the same
    with ``accumulate_grad_batches=2``; "manual": two optimizers, each step clipped) on one XLA device
    (``strategy=None``) or with ``strategy``. With ``resume_from``, a second epoch from that checkpoint."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint

    record: Dict[str, Any] = {}
    dumped_before = set(_dumped_modules())
    model = _module(scenario, record)
    checkpoint = ModelCheckpoint(dirpath=os.path.join(tmp_dir, "checkpoints"), monitor="val_loss",
                                 save_top_k=save_top_k, mode=mode)
    kwargs = dict(devices=1) if strategy is None else dict(strategy=strategy)
    if scenario != "manual":
        kwargs["gradient_clip_val"] = CLIP
    if scenario == "accumulate":
        kwargs["accumulate_grad_batches"] = 2
    trainer = Trainer(
        accelerator="tpu",
        max_epochs=1 if resume_from is None else 2,
        default_root_dir=tmp_dir,
        logger=False,
        enable_model_summary=False,
        callbacks=[_counting_callback(record), checkpoint],
        **kwargs,
    )
    trainer.fit(model, ckpt_path=resume_from)
    record["weights"] = {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()}
    record["val_loss"] = float(trainer.callback_metrics["val_loss"])
    record["progress_bar_loss"] = float(trainer.progress_bar_metrics["loss"])
    record["checkpoint"] = checkpoint.best_model_path
    record["best_k_models"] = sorted(checkpoint.best_k_models)
    # the collectives of the graphs XLA compiled during this run (with XLA_FLAGS=--xla_dump_to=...)
    record["collectives"] = [c for c in collectives() if c["file"] not in dumped_before]
    return record


def trainer_runs(strategy: Optional[str], tmp_dir: str, resume_from: Optional[str] = None,
                 scenarios=("clip", "accumulate", "manual")) -> Dict[str, Any]:
    """Every scenario, then a second epoch of "clip" resumed from the checkpoint ``resume_from`` (written by another
    run, e.g. on one device), by default from this run's own "clip" checkpoint."""
    runs = {s: trainer_run(s, strategy, os.path.join(tmp_dir, s)) for s in scenarios}
    resume_from = resume_from or runs["clip"]["checkpoint"]
    runs["resume"] = trainer_run("clip", strategy, os.path.join(tmp_dir, "resume"), resume_from=resume_from)
    if strategy == "xla_spmd_fsdp":
        # FSDPv2 with an auto-wrap policy: each Linear wrapped in SpmdFullyShardedDataParallel
        import functools

        from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

        from pytorch_lightning.strategies import XLASPMDFSDPStrategy

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={torch.nn.Linear})
        runs["autowrap"] = trainer_run("clip", XLASPMDFSDPStrategy(auto_wrap_policy=policy),
                                       os.path.join(tmp_dir, "autowrap"))
    return runs


def _dumped_modules() -> List[str]:
    """The partitioned HLO modules XLA dumped so far (``XLA_FLAGS=--xla_dump_to=DIR``), oldest first."""
    match = re.search(r"--xla_dump_to=(\S+)", os.environ.get("XLA_FLAGS", ""))
    if not match:
        return []
    return sorted(glob.glob(os.path.join(match.group(1), "*after_optimizations.txt")))


def collectives() -> List[Dict[str, int]]:
    """The collectives of every module XLA compiled, read from ``XLA_FLAGS=--xla_dump_to`` (the partitioned HLO)."""
    found = []
    for path in _dumped_modules():
        text = open(path).read()
        found.append({
            "file": path,
            "all-reduce": len(re.findall(r"= [^=]*\ball-reduce(?:-start)?\(", text)),
            "all-gather": len(re.findall(r"= [^=]*\ball-gather(?:-start)?\(", text)),
            "reduce-scatter": len(re.findall(r"= [^=]*\breduce-scatter\(", text)),
        })
    return found


def misconfigurations(strategy: str, tmp_dir: str) -> Dict[str, str]:
    """The message of each ``MisconfigurationException`` a wrong setup raises (``""`` when none was raised).

    Run in the SPMD process after the real runs: a batch the data axis cannot divide, a mesh shape that does not
    hold the devices. Run in a process that used one XLA device before: SPMD asked for too late.
    """
    from pytorch_lightning import Trainer
    from pytorch_lightning.strategies import StrategyRegistry
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    def message(fn) -> str:
        try:
            fn()
        except MisconfigurationException as err:
            return str(err)
        return ""

    def fit(batch_size: int = BATCH, devices: Any = "auto", **strategy_kwargs) -> None:
        model = _module("clip", {})
        model.train_dataloader = lambda: torch.utils.data.DataLoader(_data(48, 0), batch_size=batch_size)
        chosen = StrategyRegistry[strategy]["strategy"](**strategy_kwargs) if strategy_kwargs else strategy
        trainer = Trainer(accelerator="tpu", strategy=chosen, devices=devices, max_steps=2, default_root_dir=tmp_dir,
                          logger=False, enable_checkpointing=False, enable_model_summary=False,
                          num_sanity_val_steps=0, limit_val_batches=0)
        trainer.fit(model)

    return {
        "indivisible_batch": message(lambda: fit(batch_size=6)),
        "mesh_shape": message(lambda: fit(mesh_shape=(3,))),
        "devices": message(lambda: fit(devices=1)),
        "default": message(fit),
    }


def lite_run(scenario: str, strategy: Optional[str]) -> Dict[str, Any]:
    """One ``LightningLite`` loop of ``scenario`` ("clip": every step clipped by the norm; "accumulate": two batches
    per update, the first under ``no_backward_sync``; "manual": two optimizers, each step clipped) on one XLA device
    (``strategy=None``) or with ``strategy``; the loss is read on the host after every update."""
    from lightning_lite import LightningLite

    record: Dict[str, Any] = {}
    accumulate = 2 if scenario == "accumulate" else 1

    class Lite(LightningLite):
        def run(self) -> None:
            net = _net()
            if scenario == "manual":
                model, opt0, opt1 = self.setup(net, torch.optim.SGD(net[0].parameters(), lr=0.5, momentum=0.9),
                                               torch.optim.Adam(net[2].parameters(), lr=0.01))
                optimizers = [opt0, opt1]
            else:
                model, opt = self.setup(net, torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9))
                optimizers = [opt]
            loader = self.setup_dataloaders(torch.utils.data.DataLoader(_data(BATCH * STEPS, 0), batch_size=BATCH))
            losses = []
            for i, (x, y) in enumerate(loader):
                if i == WARM_UP:
                    record["start"] = counters()
                for opt in optimizers:
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    stepping = (i + 1) % accumulate == 0
                    if stepping:
                        self.backward(loss / accumulate)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                        opt.step()
                        opt.zero_grad()
                        losses.append(loss.item())
                    else:
                        with self.no_backward_sync(model):
                            self.backward(loss / accumulate)
            end = counters()
            record["train"] = {k: (end[k] - record["start"][k]) / (STEPS - WARM_UP) for k in end}
            record["sharding"] = sharding(model.module)
            record["losses"] = losses
            record["weights"] = {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()}

    kwargs = dict(devices=1) if strategy is None else dict(strategy=strategy)
    Lite(accelerator="tpu", **kwargs).run()
    return record


def lite_runs(strategy: Optional[str]) -> Dict[str, Any]:
    return {s: lite_run(s, strategy) for s in ("clip", "accumulate", "manual")}


def batch_types_run(strategy: Optional[str], tmp_dir: str) -> Dict[str, Any]:
    """The layouts of the batches the steps of the Trainer and a Lite loop get, on batches of every collection type
    (``helpers.xla_batch_types``), on one XLA device (``strategy=None``) or with ``strategy``."""
    from pytorch_lightning import Trainer

    from helpers.xla_batch_types import lite_layouts
    from helpers.xla_batch_types import trainer_kwargs
    from helpers.xla_batch_types import trainer_run as trainer_batch_types

    kwargs = dict(devices=1) if strategy is None else dict(strategy=strategy)
    trainer = trainer_batch_types(
        lambda **more: Trainer(accelerator="tpu", **kwargs, **trainer_kwargs(tmp_dir), **more), batches=4)
    return {"trainer": trainer, "lite": lite_layouts(accelerator="tpu", **kwargs)}


def patterns_run(strategy: Optional[str], tmp_dir: str, precision: Any = "bf16") -> Dict[str, Any]:
    """Everyday patterns together: ``precision="bf16"``, a torchmetrics metric logged on step and epoch next to the
    loss (both on the progress bar), clipping; then ``Trainer.test`` and ``Trainer.predict``. Returns the counters
    per steady batch of each loop, the parameters' dtype and the test loss."""
    import torchmetrics

    from pytorch_lightning import Callback, LightningModule, Trainer

    record: Dict[str, Any] = {}
    test_batches = 6

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()
            self.accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=4)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            self.accuracy(logits, y)
            self.log("accuracy", self.accuracy, on_step=True, on_epoch=True)
            self.log("loss", loss, prog_bar=True)
            return loss

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_loss", torch.nn.functional.cross_entropy(self.net(x).float(), y))

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return self.net(batch[0]).argmax(-1)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(_data(BATCH * STEPS, 0), batch_size=BATCH)

        def test_dataloader(self):
            return torch.utils.data.DataLoader(_data(BATCH * test_batches, 2), batch_size=BATCH)

        def predict_dataloader(self):
            return self.test_dataloader()

    def start(stage: str) -> None:
        record[stage + "_start"] = counters()

    def stop(stage: str, batches: int) -> None:
        end = counters()
        record[stage] = {k: (end[k] - record[stage + "_start"][k]) / batches for k in end}

    class Count(Callback):
        # steady batches: training from WARM_UP on, test and predict from their third batch on
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == WARM_UP:
                start("train")
                record["dtype"] = str(next(pl_module.parameters()).dtype)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == STEPS - 1:
                stop("train", STEPS - WARM_UP)

        def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if batch_idx == 2:
                start("test")

        def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if batch_idx == test_batches - 1:
                stop("test", test_batches - 2)

        def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
            if batch_idx == 2:
                start("predict")

        def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
            if batch_idx == test_batches - 1:
                stop("predict", test_batches - 2)

    model = Model()
    kwargs = dict(devices=1) if strategy is None else dict(strategy=strategy)
    trainer = Trainer(accelerator="tpu", precision=precision, gradient_clip_val=CLIP, max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, default_root_dir=tmp_dir,
                      callbacks=[Count()], **kwargs)
    trainer.fit(model)
    record["accuracy"] = float(trainer.callback_metrics["accuracy_epoch"])
    record["test_loss"] = trainer.test(model, verbose=False)[0]["test_loss"]
    predictions = trainer.predict(model)
    record["predictions"] = torch.cat([p.cpu() for p in predictions]).tolist()
    return record


def interrupt_and_profile(strategy: str, tmp_dir: str) -> Dict[str, Any]:
    """A fit stopped by Ctrl-C (``KeyboardInterrupt`` from a callback after 4 steps), then, in the same process, a
    whole fit with ``profiler="xla"`` and validation."""
    from pytorch_lightning import Callback, Trainer

    class CtrlC(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 3:
                raise KeyboardInterrupt

    common = dict(accelerator="tpu", strategy=strategy, max_epochs=1, logger=False, enable_checkpointing=False,
                  enable_model_summary=False, default_root_dir=tmp_dir)
    interrupted = Trainer(callbacks=[CtrlC()], **common)
    interrupted.fit(_module("clip", {}))
    profiled = Trainer(profiler="xla", limit_val_batches=2, **common)
    profiled.fit(_module("clip", {}))
    return {
        "interrupted": interrupted.interrupted,
        "interrupted_status": str(interrupted.state.status),
        "interrupted_steps": interrupted.global_step,
        "profiled_steps": profiled.global_step,
        "profiled_val_loss": float(profiled.callback_metrics["val_loss"]),
    }


def listing(path: str) -> List[str]:
    """Every file under ``path`` (a local directory or an fsspec URL), relative to it, sorted; [] when it is gone."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(path)
    root = root.rstrip("/")
    fs.invalidate_cache()
    if not fs.exists(root):
        return []
    return sorted(p[len(root) + 1:] for p in fs.find(root))


_KILLED_SAVE = """
import os, signal, sys, torch
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from lightning_lite.strategies.xla_spmd import _save_sharded

def killed(self, metadata, results):
    os.kill(os.getpid(), signal.SIGKILL)  # the shards are written; the metadata and the commit marker are not

FsspecWriter.finish = killed
_save_sharded({"state_dict": {"net.0.weight": torch.ones(32, 16)}, "epoch": 7}, sys.argv[1])
"""


def sharded_checkpoint_run(strategy: str, root: str) -> Dict[str, Any]:
    """``state_dict_type="sharded"`` under ``root`` (a local directory or an fsspec URL such as ``gs://bucket/run``):
    one epoch of "clip" writes its checkpoint; a process killed inside the writer while saving into the same path
    leaves an uncommitted version; a second epoch resumes from the path; a save into it that fails inside the writer,
    then one that succeeds; last, a resumed epoch with ``save_top_k=1`` that replaces the first checkpoint."""
    import subprocess
    import sys

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    from pytorch_lightning import Trainer
    from pytorch_lightning.strategies import StrategyRegistry

    def make():
        return StrategyRegistry[strategy]["strategy"](state_dict_type="sharded")

    first = trainer_run("clip", make(), f"{root}/first")
    path = first["checkpoint"]
    metadata = FsspecReader(f"{path}/00000001").read_metadata().state_dict_metadata
    record: Dict[str, Any] = {
        "path": path,
        "files": listing(path),
        "chunks": {k: len(v.chunks) for k, v in metadata.items() if hasattr(v, "chunks")},
        "first_weights": first["weights"],
    }

    # killed halfway through a save: version 2 has shards, no metadata and no commit marker
    from helpers.xla_subprocess import subprocess_env

    env = subprocess_env({"CPU_NUM_DEVICES": None})
    killed = subprocess.run([sys.executable, "-c", _KILLED_SAVE, path], env=env, capture_output=True, text=True,
                            timeout=120)
    record["killed_returncode"] = killed.returncode
    record["files_after_kill"] = listing(path)

    # the resumed run reads version 1, the newest committed one
    resumed = trainer_run("clip", make(), f"{root}/resumed", resume_from=path)
    record["resumed_weights"] = resumed["weights"]
    record["restored_best_model_path"] = resumed["restored_best_model_path"]

    # a save that fails inside the writer, after its shards are written, leaves version 1 in place
    model = _module("clip", {})
    trainer = Trainer(accelerator="tpu", strategy=make(), max_steps=1, logger=False, enable_checkpointing=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=f"{root}/other")
    trainer.fit(model)
    real_finish = FsspecWriter.finish

    def failing_finish(self, metadata, results):
        raise OSError("disk full")

    FsspecWriter.finish = failing_finish
    try:
        trainer.save_checkpoint(path)
    except BaseException as err:  # torch.distributed.checkpoint wraps it in a CheckpointException (a BaseException)
        record["failed_save"] = "OSError: disk full" in str(err)
    finally:
        FsspecWriter.finish = real_finish
    record["files_after_failure"] = listing(path)
    record["after_failure_loads"] = sorted(
        FsspecReader(f"{path}/00000001").read_metadata().state_dict_metadata) == sorted(metadata)
    # committed: the previous version and the killed save's remains are removed
    trainer.save_checkpoint(path)
    record["files_after_success"] = listing(path)
    weights = {f"state_dict.{k}": torch.zeros_like(v) for k, v in model.state_dict().items()}
    newest = max(f.split("/")[0] for f in record["files_after_success"] if f.endswith("/COMMITTED"))
    dcp.load(weights, storage_reader=FsspecReader(f"{path}/{newest}"), no_dist=True)
    record["saved_weights_equal"] = all(
        torch.equal(weights[f"state_dict.{k}"], v.cpu()) for k, v in model.state_dict().items())

    # top-k: with `save_top_k=1`, the better second epoch (resumed in the same directory, so that the top-k comes
    # back) removes the first epoch's checkpoint, every version of it. Better is a higher validation loss here: that
    # one goes up in the second epoch of this run (lr 0.5 with momentum)
    first_topk = trainer_run("clip", make(), f"{root}/topk", save_top_k=1, mode="max")
    second_topk = trainer_run("clip", make(), f"{root}/topk", resume_from=first_topk["checkpoint"], save_top_k=1,
                              mode="max")
    record["topk_best_k_models"] = [p[len(root) + 1:] for p in first_topk["best_k_models"]
                                    + second_topk["best_k_models"]]
    record["topk_files"] = listing(f"{root}/topk/checkpoints")
    return record
