"""Sharded SPMD checkpoints (``state_dict_type="sharded"``) saved by ``ModelCheckpoint`` cost the training thread
only the copy of each device's shards to the host; ``torch.distributed.checkpoint`` writes them on the writer thread.

One process drives 4 XLA:CPU devices under ``xla_spmd`` (a full copy of each tensor per device) and ``xla_spmd_fsdp``
(each tensor in 4 shards), with real files (``helpers/xla_spmd_background_writes.py``).
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0093-feature-xla-spmd-sharded-checkpoint-writes-in-the-background.patch"

WRITER = "pl-xla-checkpoint-writer_0"
TOP_K = ["epoch=0-step=4.ckpt", "epoch=0-step=8.ckpt", "epoch=1-step=12.ckpt", "epoch=1-step=16.ckpt"]


def _runs(computed_once, fork_server, strategy):
    from helpers.xla_subprocess import run_python

    def compute(folder):
        code = f"from helpers.xla_spmd_background_writes import run\nemit(run({strategy!r}, {str(folder)!r}))"
        return run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=300,
                          fork_server=fork_server)

    return computed_once(f"spmd-background-writes-{strategy}", compute)


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
def test_sharded_checkpoints_are_written_on_the_writer_thread(computed_once, fork_server, strategy):
    run = _runs(computed_once, fork_server, strategy)
    # each step's top-k checkpoint, then `last.ckpt`, both on the writer thread
    expected = [f"{name} on {WRITER}" for top in TOP_K for name in (top, "last.ckpt")]
    assert run["background_writes"] == expected
    # one copy of the shards to the host per step: `last.ckpt` takes the top-k save's copies
    assert len(run["background_copies"]) == len(TOP_K) and all(n > 0 for n in run["background_copies"])
    # the removal of the older top-1 checkpoints waited for the writes before them
    assert run["background_files"] == ["epoch=1-step=16.ckpt", "last.ckpt"]
    # turned off, the training thread writes, from the device
    assert run["sync_writes"] == [f"{name} on MainThread" for top in TOP_K for name in (top, "last.ckpt")]
    assert run["sync_copies"] == []
    # and the files hold the same weights and optimizer state
    assert run["same_last"] and run["same_top"]


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
def test_a_failed_sharded_write_stops_the_run_with_the_path_and_the_cause(computed_once, fork_server, strategy):
    failure = _runs(computed_once, fork_server, strategy)["failure"]
    assert failure["message"] is not None
    assert "writing the sharded checkpoint" in failure["message"] and "epoch=0-step=8.ckpt" in failure["message"]
    assert "No space left on device" in failure["message"]
    # at the first step that began after the write failed, at the latest at the next save (the end of the batch
    # that begins at step 11 waits for the write in flight)
    assert 7 <= failure["last_step"] <= 11
    # the older checkpoint was not removed for one that does not exist: step 8's folder holds no committed version
    assert failure["files"] == ["epoch=0-step=4.ckpt", "epoch=0-step=8.ckpt"]
    assert failure["committed"] == ["epoch=0-step=4.ckpt"]
