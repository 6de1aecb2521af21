"""Train one small model with DDP on every TPU device of this host and save each replica's parameters.

Run by ``test_xla_ddp_sync.py`` in a fresh process (a TPU is opened by one process at a time, and ``xmp.spawn``
refuses to start once the runtime exists in the parent)::

    python ddp_sync_worker.py OUT_DIR

Each replica trains on its own, different slice of a deterministic data set (see ``replica_batches``), so
replicas only stay identical when their gradients are all-reduced. Writes ``OUT_DIR/init.pt`` (the
parameters before training) and ``OUT_DIR/rank<global rank>.pt`` (after training, with the rank, the world
size and the number of optimizer steps taken).
"""
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

STEPS = 4
BATCH = 8  # per replica and step
FEATURES = 16
CLASSES = 4
LR = 0.5
SEED = 1234


def make_model() -> torch.nn.Module:
    torch.manual_seed(SEED)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, CLASSES))


def full_data(world_size: int):
    """Every sample of the run: STEPS * world_size * BATCH, drawn on the CPU from a fixed seed."""
    g = torch.Generator().manual_seed(SEED + 1)
    n = STEPS * world_size * BATCH
    return torch.randn(n, FEATURES, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def replica_batches(rank: int, world_size: int):
    """Step s of replica r uses rows [s*W*B + r*B, s*W*B + (r+1)*B): the union over replicas is block s."""
    x, y = full_data(world_size)
    out = []
    for step in range(STEPS):
        start = (step * world_size + rank) * BATCH
        out.append((x[start:start + BATCH], y[start:start + BATCH]))
    return out


def use_highest_matmul_precision() -> bool:
    """Full fp32 matmuls on the TPU (the default uses bf16 passes), so the comparison with the CPU is tight."""
    try:
        import torch_xla.backends

        torch_xla.backends.set_mat_mul_precision("highest")
        return True
    except (ImportError, AttributeError):
        return False


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = make_model()
        self.highest_precision = False

    def on_fit_start(self):
        # runs in every replica's process, whatever the start method of the spawn
        self.highest_precision = use_highest_matmul_precision()

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)  # mean over this replica's batch

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)

    def train_dataloader(self):
        # each replica gets its own slice; Lightning must not re-shard it (replace_sampler_ddp=False)
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return DataLoader(replica_batches(rank, world), batch_size=None)


class SaveParams(pl.Callback):
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module):
        params = {k: v.detach().cpu() for k, v in pl_module.net.state_dict().items()}
        torch.save({"params": params, "global_rank": trainer.global_rank, "local_rank": trainer.local_rank,
                    "world_size": trainer.world_size, "steps": trainer.global_step,
                    "highest_precision": pl_module.highest_precision},
                   self.out_dir / f"rank{trainer.global_rank}.pt")


def main(out_dir: Path) -> None:
    model = Model()
    torch.save({k: v.detach().clone() for k, v in model.net.state_dict().items()}, out_dir / "init.pt")
    trainer = pl.Trainer(accelerator="tpu", devices="auto", max_steps=STEPS, replace_sampler_ddp=False,
                         callbacks=[SaveParams(out_dir)], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=out_dir)
    trainer.fit(model)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
