"""A layer that only one XLA replica's forward reaches: every replica still all-reduces the same gradients.

Runs through the simulated TPU host of ``helpers/gloo_xla_collectives.py`` (see ``test_xla_multiprocess.py``).
Before the fix rank 0 all-reduced 4 gradients and rank 1 6: a ``CollectiveDivergence`` here, a hang on a TPU.
"""
import pytest

from helpers.multiprocess_scenarios import check_identical_sequences, max_diff, run_scenario
from helpers.runif import RunIf

FIXED_BY = "0024-xla-every-replica-reduces-the-same-gradients.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_layer_unused_on_one_rank_is_reduced_as_a_zero_gradient(tmp_path, fork_server):
    result = run_scenario("unused_branch", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    # the gradient all-reduce takes every parameter on both ranks: 2 layers of the net, the extra layer, the loss
    grad_reduces = [e for e in result["records"][0][0]["log"] if e["op"] == "all_reduce" and e["scale"] == 0.5]
    assert grad_reduces and all(len(e["tensors"]) == 7 for e in grad_reduces), grad_reduces
    # the extra layer's update is half of rank 1's gradient, as one process on both batches computes it
    assert max_diff(result["xla"], result["cpu"]) < 1e-5
