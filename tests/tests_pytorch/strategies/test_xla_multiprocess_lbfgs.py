"""A closure optimizer (LBFGS) with several XLA processes: every rank evaluates its closure as often as the others.

Runs through the simulated TPU host of ``helpers/gloo_xla_collectives.py`` (see ``test_xla_multiprocess.py``).
"""
import pytest

from helpers.multiprocess_scenarios import check_identical_sequences, max_diff, run_scenario
from helpers.runif import RunIf

FIXED_BY = "0021-xla-closure-optimizers-decide-from-the-averaged-loss.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_lbfgs_on_rank_dependent_data_stays_in_step(tmp_path, fork_server):
    """LBFGS with the strong-Wolfe line search on data whose local losses differ between the ranks: with each
    rank's own loss they evaluated the closure (and all-reduced) a different number of times, a hang on a TPU; with
    the averaged loss (`xla-closure-optimizers-decide-from-the-averaged-loss`) they issue the same collectives and
    match one process's LBFGS on the union."""
    result = run_scenario("lbfgs", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    assert max_diff(result["xla"], result["cpu"]) < 1e-3
