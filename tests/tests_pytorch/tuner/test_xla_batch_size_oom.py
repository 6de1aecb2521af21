"""The batch-size finder backs off when an XLA device runs out of memory.

``is_oom_error`` knew CUDA's and the CPU allocator's messages only, so on a TPU the first batch size that does not fit
ended ``trainer.tune(auto_scale_batch_size=...)`` with the error instead of halving it. The messages are torch_xla's
own (PJRT runtime, as reported in pytorch/xla#8020 and #9524; XRT's from #3470): ``RESOURCE_EXHAUSTED`` raised as a
``RuntimeError`` when a device buffer cannot be allocated or a program does not fit into HBM.
"""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.runif import RunIf

FIXED_BY = "0029-xla-out-of-memory-is-an-oom-error.patch"

# what torch_xla raises on a TPU whose HBM is full, at run time and at compile time (PJRT), and under XRT
XLA_OOM = [
    "Bad StatusOr access: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 196.00M. That"
    " was not possible. There are 134.44M free.; (1x0x0_HBM0): while running replica 0 and partition 0 of a"
    " replicated computation (other replicas may have failed as well).",
    "Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm."
    " Used 21.95G of 15.48G hbm. Exceeded hbm capacity by 6.47G.",
    "RESOURCE_EXHAUSTED: Attempting to reserve 6.48G at the bottom of memory. That was not possible. There are 6.78G"
    " free, 0B reserved, and 3.33G reservable.",
]
FITS = 16


@pytest.mark.parametrize("message", XLA_OOM, ids=["pjrt-run", "pjrt-compile", "xrt"])
def test_xla_out_of_memory_is_an_oom_error(message):
    from pytorch_lightning.utilities.memory import is_oom_error

    assert is_oom_error(RuntimeError(message))


# a guard: these were never taken for out-of-memory, and must stay so
@pytest.mark.guard
@pytest.mark.parametrize("exception", [
    # a kernel's scratch memory: a smaller batch does not help
    RuntimeError("Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in"
                 " memory space vmem. Used 32.42M of 16.00M vmem."),
    RuntimeError("Bad StatusOr access: INVALID_ARGUMENT: Error allocating device buffer"),
    ValueError(XLA_OOM[0]),
    RuntimeError(XLA_OOM[0], "a second argument"),
], ids=["vmem", "other-status", "not-a-runtime-error", "two-arguments"])
def test_other_errors_are_not(exception):
    from pytorch_lightning.utilities.memory import is_oom_error

    assert not is_oom_error(exception)


def _model(oom_message):
    from pytorch_lightning import LightningModule

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 2
            self.layer = torch.nn.Linear(8, 2)
            self.tried = []

        def training_step(self, batch, batch_idx):
            (x,) = batch
            self.tried.append(x.shape[0])
            if x.shape[0] > FITS:
                raise RuntimeError(oom_message)
            return self.layer(x).sum()

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(512, 8)), batch_size=self.batch_size)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Model()


@RunIf(xla=True)
@pytest.mark.parametrize("mode", ["power", "binsearch"])
def test_batch_size_finder_backs_off_on_xla_out_of_memory(tmp_path, mode):
    from pytorch_lightning import Trainer

    model = _model(XLA_OOM[0])
    trainer = Trainer(accelerator="tpu", devices=1, max_epochs=1, auto_scale_batch_size=mode,
                      default_root_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False)
    result = trainer.tune(model, scale_batch_size_kwargs={"steps_per_trial": 1, "max_trials": 6})
    assert result["scale_batch_size"] == model.batch_size == FITS
    assert max(model.tried) == 2 * FITS, "the finder never reached a batch size that does not fit"
    trainer.fit(model)
    assert trainer.global_step == 512 // FITS
