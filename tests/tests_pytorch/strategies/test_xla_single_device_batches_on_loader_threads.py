"""On one XLA device the batches reach the device on torch_xla's loader threads, ahead of their step (fix 0061):
with the values' copy made off the training thread (0060), the training thread of a steady step neither reads from
the device nor copies to it, in every way users train below, and in validation, test and predict. Before the fix
each batch was copied on the training thread (``batch_to_device``), behind the step in flight."""
import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_waits import check_a_steady_step_never_waits, evaluation_run, pattern_module, pattern_loader
from helpers.xla_waits import pattern_run, PATTERNS

FIXED_BY = "0061-xla-single-device-batches-copied-on-loader-threads.patch"


@RunIf(xla=True)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_steady_training_step_never_waits_for_the_device(pattern, tmp_path):
    check_a_steady_step_never_waits(pattern_run(pattern, tmp_path))


@RunIf(xla=True)
def test_validation_test_and_predict_steps_never_wait_for_the_device(tmp_path):
    for stage, rows in evaluation_run(tmp_path).items():
        assert len(rows) >= 4, stage
        assert [row["reads"] + row["copies"] for row in rows] == [0] * len(rows), (stage, rows)


@pytest.mark.guard  # true before the fix too: every batch came on the host then
@RunIf(xla=True)
@pytest.mark.parametrize("hook", ["on_before_batch_transfer", "transfer_batch_to_device"])
def test_a_module_that_transforms_host_batches_still_gets_them_on_the_host(hook, tmp_path):
    """A module that overrides a hook of the batch's way to the device sees its batches on the host, as before."""
    from pytorch_lightning import Trainer

    seen = []
    module = pattern_module("automatic")

    if hook == "on_before_batch_transfer":
        def on_before_batch_transfer(batch, dataloader_idx):
            seen.append(batch[0].device.type)
            return batch
        module.on_before_batch_transfer = on_before_batch_transfer
    else:
        def transfer_batch_to_device(batch, device, dataloader_idx):
            seen.append(batch[0].device.type)
            return [t.to(device) for t in batch]
        module.transfer_batch_to_device = transfer_batch_to_device
    trainer = Trainer(accelerator="tpu", devices=1, max_steps=3, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
    trainer.fit(module, pattern_loader(3))
    assert seen == ["cpu"] * 3
    assert all(torch.isfinite(p).all() for p in module.parameters())
