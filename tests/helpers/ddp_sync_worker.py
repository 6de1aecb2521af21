"""Train one small model with DDP on every TPU device of this host and save each replica's parameters.

Run by ``test_xla_ddp_sync.py`` in a fresh process (a TPU is opened by one process at a time, and ``xmp.spawn``
refuses to start once the runtime exists in the parent)::

    python ddp_sync_worker.py OUT_DIR

Each replica trains on its own, different slice of a deterministic data set (``PROBLEM.replica_batches``, from
``helpers/ddp_replicas.py``), so replicas only stay identical when their gradients are all-reduced. Writes
``OUT_DIR/init.pt`` (the parameters before training) and ``OUT_DIR/rank<global rank>.pt`` (after training, with the
rank, the world size and the number of optimizer steps taken).
"""
import sys
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:  # run as a script: the tests directory, for `helpers`
    sys.path.insert(0, _TESTS)
from helpers.ddp_replicas import LR, DDPProblem, cpu_params  # noqa: E402

PROBLEM = DDPProblem(steps=4, seed=1234)


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
        self.net = PROBLEM.make_model()
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
        return DataLoader(PROBLEM.replica_batches(rank, world), batch_size=None)


class SaveParams(pl.Callback):
    def __init__(self, out_dir: Path):
        self.out_dir = out_dir

    def on_train_end(self, trainer, pl_module):
        torch.save({"params": cpu_params(pl_module.net), "global_rank": trainer.global_rank,
                    "local_rank": trainer.local_rank, "world_size": trainer.world_size, "steps": trainer.global_step,
                    "highest_precision": pl_module.highest_precision},
                   self.out_dir / f"rank{trainer.global_rank}.pt")


def main(out_dir: Path) -> None:
    model = Model()
    torch.save(cpu_params(model.net), out_dir / "init.pt")
    trainer = pl.Trainer(accelerator="tpu", devices="auto", max_steps=PROBLEM.steps, replace_sampler_ddp=False,
                         callbacks=[SaveParams(out_dir)], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=out_dir)
    trainer.fit(model)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
