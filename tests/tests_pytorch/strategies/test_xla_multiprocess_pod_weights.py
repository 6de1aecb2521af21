"""At the end of a ``fit`` on a pod, every host's main process finds the final weights its host wrote.

Two processes through the simulated TPU host of ``helpers/gloo_xla_collectives.py``, presented as two hosts of one
process each, sharing ``default_root_dir``; one main process stands for both hosts and loads (and deletes) one file.
Before the fix both hosts wrote ``.temp.ckpt`` and nothing was left for the other host's main process
(``FileNotFoundError`` on a pod).
"""
import pytest

from helpers.multiprocess_scenarios import run_scenario
from helpers.runif import RunIf

FIXED_BY = "0028-xla-final-weights-file-per-host.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_the_other_hosts_weights_are_left_for_it(tmp_path, fork_server):
    left = run_scenario("two_hosts", str(tmp_path), fork_server=fork_server)["left"]
    assert len(left) == 1 and left[0] in (".temp-host0.ckpt", ".temp-host1.ckpt"), left
