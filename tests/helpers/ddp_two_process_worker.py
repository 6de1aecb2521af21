"""One replica of a two-process data-parallel run on XLA:CPU, for ``test_xla_ddp_two_processes.py``.

    python ddp_two_process_worker.py VARIANT RANK WORLD_SIZE INIT_METHOD OUT_DIR

``VARIANT`` is ``trainer`` (``pytorch_lightning.Trainer``, automatic optimization), ``lite`` (a ``LightningLite``
loop that calls ``optimizer.step()`` after ``self.backward``) or ``lite_closure`` (a ``LightningLite`` loop that
passes a closure running ``zero_grad``, forward and ``self.backward`` to ``optimizer.step(closure)``).

The process installs ``gloo_xla_collectives`` (the all-reduce of torch_xla carried over gloo, world size and ordinal
patched), trains the model of ``PROBLEM.make_model`` on its own shard of the data (``PROBLEM.shard``; both from
``helpers/ddp_replicas.py``) with ``accelerator="tpu", devices=1``, and writes ``OUT_DIR/rank<RANK>.pt``: the initial
and final parameters on the CPU, how many all-reduce calls each optimizer step made, how many tensors each call
reduced, and the file of the ``pytorch_lightning`` it imported.

The test takes ``PROBLEM`` from here for its one-process reference run.
"""
import sys
from pathlib import Path
from typing import List, Tuple

import torch
import torch.nn.functional as F

_TESTS = str(Path(__file__).resolve().parents[1])
if _TESTS not in sys.path:  # run as a script: the tests directory, for `helpers`
    sys.path.insert(0, _TESTS)
from helpers.ddp_replicas import BATCH, LR, DDPProblem, cpu_params  # noqa: E402

PROBLEM = DDPProblem(steps=5, seed=2024)
VARIANTS = ("trainer", "lite", "lite_closure")


def _loader(rank: int, world_size: int) -> torch.utils.data.DataLoader:
    x, y = PROBLEM.shard(rank, world_size)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH, shuffle=False)


def _per_step(counts: List[int]) -> List[int]:
    """Cumulative call counts taken after each step -> calls made by each step."""
    return [b - a for a, b in zip([0] + counts[:-1], counts)]


def train_trainer(rank: int, world_size: int, harness) -> Tuple[torch.nn.Module, List[int]]:
    import pytorch_lightning as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = PROBLEM.make_model()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=LR)

    class CountCalls(pl.Callback):
        def __init__(self) -> None:
            self.after_step: List[int] = []

        def on_train_batch_end(self, *args, **kwargs) -> None:
            self.after_step.append(len(harness.calls))

    module = Module()
    counter = CountCalls()
    trainer = pl.Trainer(
        accelerator="tpu",
        devices=1,
        max_steps=PROBLEM.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[counter],
    )
    trainer.fit(module, _loader(rank, world_size))
    assert trainer.global_step == PROBLEM.steps, trainer.global_step
    return module.net, _per_step(counter.after_step)


def train_lite(rank: int, world_size: int, harness, closure: bool) -> Tuple[torch.nn.Module, List[int]]:
    from lightning_lite import LightningLite

    class Lite(LightningLite):
        def run(self) -> Tuple[torch.nn.Module, List[int]]:
            net = PROBLEM.make_model()
            model, optimizer = self.setup(net, torch.optim.SGD(net.parameters(), lr=LR))
            after_step: List[int] = []
            for x, y in _loader(rank, world_size):
                x, y = x.to(self.device), y.to(self.device)
                if closure:

                    def step_closure() -> torch.Tensor:
                        optimizer.zero_grad()
                        loss = F.cross_entropy(model(x), y)
                        self.backward(loss)
                        return loss

                    optimizer.step(step_closure)
                else:
                    optimizer.zero_grad()
                    loss = F.cross_entropy(model(x), y)
                    self.backward(loss)
                    optimizer.step()
                after_step.append(len(harness.calls))
            return net, _per_step(after_step)

    return Lite(accelerator="tpu", devices=1).run()


def main(argv: List[str]) -> None:
    variant, rank, world_size, init_method, out_dir = argv[0], int(argv[1]), int(argv[2]), argv[3], Path(argv[4])
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; one of {VARIANTS}")
    import pytorch_lightning
    from helpers.gloo_xla_collectives import install

    init = cpu_params(PROBLEM.make_model())
    harness = install(rank, world_size, init_method)
    try:
        if variant == "trainer":
            model, calls_per_step = train_trainer(rank, world_size, harness)
        else:
            model, calls_per_step = train_lite(rank, world_size, harness, closure=variant == "lite_closure")
        result = {
            "rank": rank,
            "init": init,
            "params": cpu_params(model),
            "calls_per_step": calls_per_step,
            "tensors_per_call": list(harness.calls),
            "pytorch_lightning": str(Path(pytorch_lightning.__file__).resolve()),
        }
        torch.save(result, out_dir / f"rank{rank}.pt")
    finally:
        harness.uninstall()


if __name__ == "__main__":
    main(sys.argv[1:])
