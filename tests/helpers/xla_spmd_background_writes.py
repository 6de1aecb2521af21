"""Sharded SPMD checkpoints written in the background (``tests_pytorch/checkpointing/
test_xla_spmd_background_checkpoint_writes.py``): runs on 4 XLA:CPU devices in one process, each recording on which
thread the shards were written, how often the shards were copied to the host, and what the files hold."""
import os
import threading
import time
from typing import Any, Dict, List, Optional

import torch
from torch.utils.data import DataLoader

STEPS = 16  # two epochs of 8 steps
EVERY = 4


def _model() -> Any:
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    class Model(BoringModel):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return DataLoader(RandomDataset(32, 64), batch_size=8, shuffle=True)

    return Model()


def _fit(strategy: str, root: str, background: bool, callbacks: List[Any], **checkpoint: Any) -> Any:
    from lightning_lite.plugins.io.xla import XLACheckpointIO
    from pytorch_lightning import seed_everything, Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.strategies import StrategyRegistry

    seed_everything(3)
    made = StrategyRegistry[strategy]["strategy"](
        state_dict_type="sharded", checkpoint_io=XLACheckpointIO(background_writes=background)
    )
    options = {"dirpath": os.path.join(root, "ckpts"), "every_n_train_steps": EVERY, "save_top_k": -1, **checkpoint}
    trainer = Trainer(accelerator="tpu", strategy=made, max_steps=STEPS, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
                      callbacks=[ModelCheckpoint(**options), *callbacks])
    trainer.fit(_model())
    return trainer


def _stored(path: str) -> Dict[str, List[float]]:
    """The weights a sharded checkpoint holds, read back with torch.distributed.checkpoint (plain tensors)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    from lightning_lite.strategies.xla_spmd import _sharded_checkpoint_dir

    directory = _sharded_checkpoint_dir(path)
    reader = FsspecReader(directory)
    stored = reader.read_metadata().state_dict_metadata
    target = {k: torch.zeros(v.size, dtype=v.properties.dtype) for k, v in stored.items()
              if k.startswith(("state_dict.", "optimizer_states.0.state.")) and hasattr(v, "size")}
    dcp.load(target, storage_reader=reader, no_dist=True)
    return {k: v.flatten().tolist() for k, v in sorted(target.items())}


def run(strategy: str, root: str) -> Dict[str, Any]:
    from lightning_lite.strategies import xla_spmd as lite_spmd
    from torch_xla.experimental.distributed_checkpoint import _helpers

    record: Dict[str, Any] = {}
    writes: List[str] = []
    copies: List[int] = []
    real_write, real_copy = lite_spmd._write_sharded, _helpers._sharded_cpu_state_dict

    def write(tensors, meta, path):
        writes.append(f"{os.path.basename(path)} on {threading.current_thread().name}")
        if os.path.basename(path).startswith("epoch="):
            time.sleep(0.5)  # still writing when `last.ckpt` is saved, and when the older top-k checkpoint goes
        real_write(tensors, meta, path)

    def copy(state_dict):
        copies.append(len(state_dict))
        return real_copy(state_dict)

    lite_spmd._write_sharded, _helpers._sharded_cpu_state_dict = write, copy
    try:
        # in the background: top-1 by step, and `last.ckpt`; a removal queued behind the write of its successor
        _fit(strategy, f"{root}/background", True, [], save_last=True, monitor="step", mode="max", save_top_k=1)
        record["background_writes"], record["background_copies"] = list(writes), list(copies)
        record["background_files"] = sorted(os.listdir(f"{root}/background/ckpts"))
        writes.clear(), copies.clear()
        _fit(strategy, f"{root}/sync", False, [], save_last=True)
        record["sync_writes"], record["sync_copies"] = list(writes), list(copies)
    finally:
        lite_spmd._write_sharded, _helpers._sharded_cpu_state_dict = real_write, real_copy
    record["same_last"] = _stored(f"{root}/background/ckpts/last.ckpt") == _stored(f"{root}/sync/ckpts/last.ckpt")
    record["same_top"] = _stored(f"{root}/background/ckpts/epoch=1-step=16.ckpt") == _stored(
        f"{root}/sync/ckpts/epoch=1-step=16.ckpt")
    record["failure"] = _failed_write(strategy, f"{root}/failing")
    return record


def _failed_write(strategy: str, root: str) -> Dict[str, Any]:
    """A sharded write that fails on the writer thread (the storage refuses the shards of step 8's checkpoint) stops
    the run at a later step, with the path and the cause, and step 4's checkpoint stays."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from pytorch_lightning import Callback

    steps: List[int] = []

    class Steps(Callback):
        def on_train_batch_start(self, trainer, *args):
            steps.append(trainer.global_step)

    real = FsspecWriter.write_data

    def write_data(self, plan, planner):
        if "step=8" in str(self.path):
            raise OSError(28, "No space left on device")
        return real(self, plan, planner)

    FsspecWriter.write_data = write_data
    message: Optional[str] = None
    try:
        _fit(strategy, root, True, [Steps()], monitor="step", mode="max", save_top_k=1)
    except RuntimeError as err:
        message = str(err)
    finally:
        FsspecWriter.write_data = real
    from lightning_lite.strategies.xla_spmd import _sharded_checkpoint_dir

    folder = os.path.join(root, "ckpts")
    return {"message": message, "last_step": steps[-1] if steps else None, "files": sorted(os.listdir(folder)),
            "committed": sorted(n for n in os.listdir(folder) if _sharded_checkpoint_dir(os.path.join(folder, n)))}
