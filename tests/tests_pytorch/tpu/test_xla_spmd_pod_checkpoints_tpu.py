"""Sharded SPMD checkpoints on a real pod slice: every host writes its shards into one version that process 0 commits.

Runs on a multi-host Cloud TPU VM slice (e.g. a v4-16 or v5p-16), started on every worker at once with the same
command and the same ``PL_TEST_POD_CHECKPOINT_URL``, a prefix in a bucket every host can write (a new one per run)::

    gcloud compute tpus tpu-vm ssh $TPU --zone $ZONE --worker=all --command \\
      "cd lightning-xla && PL_TEST_POD_CHECKPOINT_URL=gs://$BUCKET/pod-test/$(date +%s) \\
       python -m pytest -q tests/tests_pytorch/tpu/test_xla_spmd_pod_checkpoints_tpu.py"

(``$(date +%s)`` is expanded once, on the machine that runs ``gcloud``.) It is skipped on one host and without the
URL. Each host trains one epoch with ``xla_spmd_fsdp`` and ``state_dict_type="sharded"`` into the bucket, then a
second epoch resumed from that checkpoint; the hosts connect over gloo with torch_xla's ``xla://`` init method. The
two-host version of these checks on XLA:CPU is
``tests_pytorch/strategies/test_xla_spmd_sharded_checkpoints_on_a_pod.py``.
"""
import os

import pytest

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

FIXED_BY = "0063-feature-xla-spmd-sharded-checkpoints-on-a-pod.patch"
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RUN = """
import sys
sys.path.insert(0, {tests!r})
import torch_xla.runtime as xr
from pytorch_lightning.strategies import XLASPMDFSDPStrategy
from helpers.xla_spmd_runs import listing, trainer_run

url = {url!r}
first = trainer_run("clip", XLASPMDFSDPStrategy(state_dict_type="sharded"), url + "/first")
files = listing(first["checkpoint"])
resumed = trainer_run("clip", XLASPMDFSDPStrategy(state_dict_type="sharded"), url + "/resumed",
                      resume_from=first["checkpoint"])
emit({{"count": xr.process_count(), "index": xr.process_index(), "checkpoint": first["checkpoint"], "files": files,
       "restored_best_model_path": resumed["restored_best_model_path"]}})
"""


@RunIf(tpu=True)
@pytest.mark.slow
def test_every_host_writes_its_shards_into_one_committed_version():
    url = os.environ.get("PL_TEST_POD_CHECKPOINT_URL")
    if not url:
        pytest.skip("set PL_TEST_POD_CHECKPOINT_URL (a bucket prefix every host writes) on every host of the slice")
    count = run_python("import torch_xla, torch_xla.runtime as xr\ntorch_xla.device()\nemit(xr.process_count())",
                       env={"PJRT_DEVICE": "TPU"}, timeout=300)
    if count == 1:
        pytest.skip("a pod slice: this TPU VM is a single host (process_count() == 1)")
    run = run_python(_RUN.format(tests=TESTS_DIR, url=url.rstrip("/")), env={"PJRT_DEVICE": "TPU"}, timeout=1200)
    assert run["count"] == count > 1
    assert run["checkpoint"].startswith(url.rstrip("/") + "/first/checkpoints/epoch=0-")
    # one version, with one shard file per host (each host holds its own shards of every parameter), committed;
    # every host sees the same listing once the save returned
    expected = sorted(["00000001/.metadata", "00000001/COMMITTED", "00000001/lightning_meta.pt"]
                      + [f"00000001/__{i}_0.distcp" for i in range(count)])
    assert run["files"] == expected
    # the second epoch resumed from it (ModelCheckpoint's state came back with it)
    assert run["restored_best_model_path"] == run["checkpoint"]
