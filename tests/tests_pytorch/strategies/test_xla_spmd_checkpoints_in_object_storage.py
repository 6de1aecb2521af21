"""SPMD checkpoints in object storage: ``gs://`` URLs through ``gcsfs`` against a real GCS emulator
(``helpers/gcs_emulator.py``), from one process driving 4 XLA:CPU devices (``xla_spmd_fsdp``).

Before, ``state_dict_type="sharded"`` took the URL for a local path: the shards went into a directory literally named
``gs:/bucket/...`` under the working directory, and resuming from the URL failed. Now a sharded checkpoint is a prefix
of versions in the bucket, each committed by a marker object written last (``check_sharded_checkpoint_versions``):
the same layout and guarantees as on the local disk, a killed save (a process killed inside the writer) and a failed
one included. Whole ``.ckpt`` checkpoints went to the bucket already and still do.
"""
import os

import pytest

from helpers.runif import RunIf
from helpers.xla_spmd_checks import check_sharded_checkpoint_versions, max_difference, TOLERANCE

FIXED_BY = "0056-feature-xla-spmd-sharded-checkpoints-in-object-storage.patch"
STRATEGY = "xla_spmd_fsdp"
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RUN = """
import sys
sys.path.insert(0, {tests!r})
from helpers.xla_spmd_runs import listing, sharded_checkpoint_run, trainer_run

root = {root!r}
sharded = sharded_checkpoint_run({strategy!r}, root + "/sharded")
# whole checkpoints: the same first epoch as the sharded run, and a second epoch resumed from the bucket
full = trainer_run("clip", {strategy!r}, root + "/full")
full_resumed = trainer_run("clip", {strategy!r}, root + "/full_resumed", resume_from=full["checkpoint"])
emit({{
    "sharded": sharded,
    "full": {{"checkpoint": full["checkpoint"], "weights": full["weights"], "files": listing(root + "/full"),
              "resumed_weights": full_resumed["weights"],
              "restored_best_model_path": full_resumed["restored_best_model_path"]}},
}})
"""


@pytest.fixture(scope="module")
def spmd_gcs_run(gcs_emulator, computed_once, fork_server):
    """The runs, in a fresh process with 4 XLA:CPU devices, in a bucket of their own; the working directory is an
    empty folder, so that anything written to a local path named after the URL would show there. Made once per
    session (the ``computed_once`` fixture), in the emulator of the pytest-xdist worker that makes it: the tests read
    only what the runs reported."""
    def run(folder):
        import gcsfs

        from helpers.xla_subprocess import run_python

        env = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}
        gcsfs.GCSFileSystem(token="anon", endpoint_url=gcs_emulator.url,
                            skip_instance_cache=True).mkdir("spmd-checkpoints")
        cwd = folder / "spmd_gcs_cwd"
        cwd.mkdir()
        code = _RUN.format(tests=TESTS_DIR, root="gs://spmd-checkpoints/run", strategy=STRATEGY)
        result = run_python(code, env=env, timeout=300, cwd=str(cwd), fork_server=fork_server,
                            set_env=gcs_emulator.env())
        result["local"] = sorted(os.listdir(cwd))
        return result

    return computed_once("spmd-gcs", run)


@RunIf(xla=True)
@pytest.mark.slow
def test_sharded_checkpoint_versions_in_gcs(spmd_gcs_run):
    run = spmd_gcs_run["sharded"]
    assert run["path"] == "gs://spmd-checkpoints/run/sharded/first/checkpoints/epoch=0-step=12.ckpt"
    check_sharded_checkpoint_versions(run, STRATEGY)


@RunIf(xla=True)
@pytest.mark.slow
def test_resume_from_a_sharded_checkpoint_in_gcs_equals_a_whole_one(spmd_gcs_run):
    """The sharded first epoch and the second resumed from the bucket (past the killed save's uncommitted version)
    equal the same two epochs through whole checkpoints in the bucket, which restored ``ModelCheckpoint``'s state."""
    sharded, full = spmd_gcs_run["sharded"], spmd_gcs_run["full"]
    assert full["files"] == ["checkpoints/epoch=0-step=12.ckpt"]
    assert full["restored_best_model_path"] == full["checkpoint"]
    assert max_difference(full["weights"], sharded["first_weights"]) < TOLERANCE
    assert max_difference(full["resumed_weights"], sharded["resumed_weights"]) < TOLERANCE


@RunIf(xla=True)
@pytest.mark.slow
def test_nothing_is_written_to_a_local_directory_named_after_the_url(spmd_gcs_run):
    assert spmd_gcs_run["local"] == []


@RunIf(xla=True)
def test_a_checkpoint_of_the_symlink_layout_loads_and_the_next_save_converts_it(tmp_path):
    """Sharded checkpoints written before the versions (a symbolic link to a hidden directory of shards) still load,
    and a save into the same path writes a committed version there and drops the old files; removal takes the link
    and its directory. Plain CPU tensors: this is about the files, not the devices."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    from lightning_lite.strategies.xla_spmd import _remove_sharded, _save_sharded, _sharded_checkpoint_dir
    from lightning_lite.utilities.cloud_io import _load

    hidden = tmp_path / ".last.ckpt.0123456789ab.sharded"
    dcp.save({"state_dict": {"w": torch.ones(3)}}, storage_writer=dcp.FileSystemWriter(str(hidden)), no_dist=True)
    torch.save({"epoch": 1}, hidden / "lightning_meta.pt")
    path = tmp_path / "last.ckpt"
    path.symlink_to(hidden.name)

    def read():
        directory = _sharded_checkpoint_dir(path)
        state = {"state_dict.w": torch.zeros(3)}
        dcp.load(state, storage_reader=FsspecReader(directory), no_dist=True)
        return directory, state["state_dict.w"].tolist(), _load(f"{directory}/lightning_meta.pt")["epoch"]

    assert read() == (f"file://{path}", [1.0, 1.0, 1.0], 1)
    _save_sharded({"state_dict": {"w": torch.full((3,), 2.0)}, "epoch": 2}, str(path))
    assert read() == (f"file://{path}/00000001", [2.0, 2.0, 2.0], 2)
    assert sorted(os.listdir(hidden)) == ["00000001"]
    assert sorted(os.listdir(hidden / "00000001")) == [".metadata", "COMMITTED", "__0_0.distcp", "lightning_meta.pt"]
    _remove_sharded(str(path))
    assert os.listdir(tmp_path) == []
