"""The Trainer's two replicas stay in sync with one all-reduce per update, which also carries the closure's loss.

Two real OS processes, as in ``test_xla_ddp_two_processes.py`` (both use ``helpers/ddp_two_process_pair.py``).
The Trainer's automatic optimization runs its step in a closure: the gradients are averaged right after the
closure's backward, and the loss the closure returns rides in that same all-reduce, so that an optimizer deciding
from the loss (LBFGS) decides alike on every replica. Without that, the call carried the gradients alone.
"""
import pytest

from helpers.ddp_two_process_pair import check_in_sync, check_one_reduce_per_step, run_pair
from helpers.runif import RunIf

FIXED_BY = "0021-xla-closure-optimizers-decide-from-the-averaged-loss.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_trainer_two_processes_stay_in_sync(tmp_path):
    """One all-reduce per update, over the gradients and the closure's loss; replicas equal the one-process
    reference."""
    check_one_reduce_per_step(check_in_sync(run_pair("trainer", tmp_path)), closure_loss=True)
