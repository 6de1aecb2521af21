"""What the SPMD tests compare the runs of ``helpers/xla_spmd_fixtures.py`` with: the device count, the float32
tolerance, the largest difference between two sets of weights, and the layout a sharded checkpoint leaves in storage
(local or in a bucket). Shared by the Trainer's SPMD tests (``tests_pytorch/strategies/test_xla_spmd*.py``)."""
import torch

DEVICES = 4
TOLERANCE = 1e-5  # float32; measured differences are below 1e-7


def max_difference(a, b):
    """The largest absolute difference between two dicts of weights (nested lists or tensors) with the same keys."""
    assert a.keys() == b.keys()
    return max((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max().item() for k in a)


def check_sharded_checkpoint_versions(run, strategy):
    """What ``state_dict_type="sharded"`` leaves in storage, local or an fsspec URL alike
    (``helpers.xla_spmd_runs.sharded_checkpoint_run``). The checkpoint is a directory of versions, each committed by
    a ``COMMITTED`` marker written last: ``torch.distributed.checkpoint`` shards (FSDPv2: each tensor in 4 chunks, one
    per device; data parallel: one copy of each) and Lightning's other state. A process killed inside the writer
    leaves an uncommitted version that loading ignores; a save that fails inside the writer leaves nothing of itself;
    the next committed save removes both the previous version and the killed one's remains; top-k removal takes a
    checkpoint away whole."""
    version = ["{v}/.metadata", "{v}/COMMITTED", "{v}/__0_0.distcp", "{v}/lightning_meta.pt"]
    first, third = [f.format(v="00000001") for f in version], [f.format(v="00000003") for f in version]
    assert run["files"] == first
    chunks = 4 if strategy == "xla_spmd_fsdp" else 1
    assert set(run["chunks"].values()) == {chunks}
    assert sorted(run["chunks"]) == sorted(
        [f"state_dict.net.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")]
        + [f"optimizer_states.0.state.{i}.momentum_buffer" for i in range(4)]
    )
    assert run["killed_returncode"] == -9
    assert run["files_after_kill"] == sorted(first + ["00000002/__0_0.distcp"])
    assert run["restored_best_model_path"] == run["path"]
    assert run["failed_save"] is True
    assert run["files_after_failure"] == run["files_after_kill"] and run["after_failure_loads"]
    assert run["files_after_success"] == third and run["saved_weights_equal"]
    assert run["topk_best_k_models"] == ["topk/checkpoints/epoch=0-step=12.ckpt",
                                         "topk/checkpoints/epoch=1-step=24.ckpt"]
    assert run["topk_files"] == [f"epoch=1-step=24.ckpt/{f}" for f in first]
