"""The ranks of XLA processes on a pod of several hosts come from the XLA runtime.

Two processes through the simulated TPU host of ``helpers/gloo_xla_collectives.py``, presented as two hosts of one
process each (local ordinal 0 on both, host index 0 and 1). Before the fix the connector replaced
``XLAEnvironment`` by ``LightningEnvironment``: both processes were global rank 0 of node 0, and their distributed
samplers served the same samples.
"""
import pytest

from helpers.multiprocess_scenarios import check_identical_sequences, run_scenario
from helpers.runif import RunIf

FIXED_BY = "0027-xla-ranks-come-from-the-xla-runtime.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_every_host_has_its_own_ranks(tmp_path, fork_server):
    result = run_scenario("two_hosts", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    assert result["ranks"] == [
        # `rank_zero_only.rank` too: rank_zero_warn/info speak from global rank 0 only
        {"global_rank": r, "local_rank": 0, "node_rank": r, "world_size": 2, "sampler_rank": r, "sampler_replicas": 2,
         "rank_zero_only": r}
        for r in range(2)
    ]
