"""Sharded SPMD checkpoints on a pod: the hosts save one version together.

With several processes (hosts), each host used to number and commit its own version of a sharded checkpoint and then
remove every other version, which could remove another host's save while it was written. Now process 0 chooses the
version and shares it over a gloo group (torch_xla's ``xla://`` init method), every host writes its shards into it,
process 0 commits it once every host has finished, and only process 0 removes versions.

Two OS processes stand for the two hosts (``helpers/xla_spmd_pod.py``), each its own SPMD XLA:CPU runtime, writing
into one bucket of the GCS emulator. The XLA runtime's ``process_count()`` and ``process_index()`` are the only
stand-in: they report 2 and the host's index, as a pod's runtime does (XLA:CPU cannot run one runtime over two
processes).
One host's save is stopped inside its writer and the test kills that host with ``SIGKILL``.
"""
import signal

import pytest

from helpers.gcs_emulator import gcs_objects
from helpers.runif import RunIf

FIXED_BY = "0063-feature-xla-spmd-sharded-checkpoints-on-a-pod.patch"


def _version(v):
    return [f"{v}/.metadata", f"{v}/COMMITTED", f"{v}/__0_0.distcp", f"{v}/__1_0.distcp", f"{v}/lightning_meta.pt"]


@pytest.fixture
def pod(fork_server, gcs_env, tmp_path):
    """``pod(name, scripts, kill_in_writer=None)``: a run of the two hosts (``helpers.xla_spmd_pod.run_pod``) in the
    test's bucket, reporting into ``tmp_path / name``."""
    from helpers.xla_spmd_pod import host_env, HOSTS, run_pod

    servers = [fork_server(host_env(rank, gcs_env)) for rank in range(HOSTS)]

    def run(url, name, scripts, kill_in_writer=None):
        folder = tmp_path / name
        folder.mkdir()
        return run_pod(servers, url, str(folder), scripts, kill_in_writer)

    return run


@RunIf(xla=True)
@pytest.mark.slow
def test_two_hosts_save_one_version_together_and_a_killed_host_commits_nothing(gcs_bucket, pod):
    url = f"{gcs_bucket}/pod"
    ckpt = url[len("gs://"):] + "/last.ckpt"

    # the first run: two saves, then a third in which host 1 is killed inside its writer
    common = ["train", "save", "train", "save", "train"]
    run = pod(url, "first", [common + ["save"], common + ["hang-in-writer", "save"]], kill_in_writer=1)
    (host0, host1), at_kill, logs = run["reports"], run["at_kill"], run["output"]
    assert run["returncodes"] == [1, -signal.SIGKILL], logs
    assert host1 is None  # killed before it could report
    saves = [s for s in host0["steps"] if s["step"] == "save"]
    # one version per save, chosen by process 0; both hosts wrote shards into it; the previous version went
    assert saves[0]["files"] == _version("00000001"), logs
    assert saves[1]["files"] == _version("00000002")
    # the killed save: host 1's shards were in version 3, never committed; host 0's save failed and dropped it
    assert "00000003/__1_0.distcp" in at_kill
    assert "00000003/COMMITTED" not in at_kill and "00000003/.metadata" not in at_kill
    assert set(_version("00000002")) <= set(at_kill)
    assert "error" in saves[2]
    assert gcs_objects(f"{url}/last.ckpt") == _version("00000002")
    assert host0["removed"] == [f"{ckpt}/00000001", f"{ckpt}/00000003"]
    trained = [s["weights"] for s in host0["steps"] if s["step"] == "train"]

    # the job restarts: both hosts resume from the committed version, save a new one together, and remove it
    run = pod(url, "restarted", [["setup", "load", "save", "remove"]] * 2)
    (host0, host1), logs = run["reports"], run["output"]
    assert run["returncodes"] == [0, 0], logs
    for host in (host0, host1):
        # the hosts connected at setup: torch.distributed is initialised, and a torchmetrics metric still computes
        # its host's (global) value, not the sum over the hosts
        assert host["steps"][0]["sum"] == 3.0
        loaded = host["steps"][1]
        assert loaded["loaded_step"] == 2 and loaded["momentum_buffers"] == 4
        assert loaded["weights"] == trained[1]
    assert host0["steps"][2]["files"] == _version("00000003")
    assert gcs_objects(url) == []
    # only process 0 removed anything
    assert host0["removed"] == [f"{ckpt}/00000002", ckpt]
    assert host1["removed"] == []


@RunIf(xla=True)
@pytest.mark.slow
def test_storage_the_hosts_do_not_share_is_refused_and_nothing_is_committed(gcs_bucket, pod, tmp_path):
    """A local path on a pod is each host's own disk unless it is a shared filesystem: host 1's shards would be
    where process 0 never looks. Every host sees that process 0's metadata is missing on its side before anything
    is committed, and the save fails on both with what to do."""
    run = pod(gcs_bucket, "unshared", [["save-unshared"]] * 2)
    (host0, host1), logs = run["reports"], run["output"]
    assert run["returncodes"] == [1, 1], logs
    for host in (host0, host1):
        assert "MisconfigurationException: The hosts of this pod do not share the storage of 'unshared/last.ckpt':" \
               " hosts [1] do not see what process 0 wrote there" in host["steps"][0]["error"]
        assert "a bucket (`gs://...`) or a shared filesystem" in host["steps"][0]["error"]
    # process 0 dropped its part; host 1's shards on its own disk were never committed
    assert host0["steps"][0]["files"] == []
    assert host1["steps"][0]["files"] == ["last.ckpt/00000001/__1_0.distcp"]
