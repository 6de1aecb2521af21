"""Data-parallel training on XLA with two real OS processes: the replicas stay in sync, once per update.

Each test starts two processes (``helpers/ddp_two_process_worker.py``, started by
``helpers/ddp_two_process_pair.py``), each with its own XLA:CPU device
(``PJRT_DEVICE=CPU``), which train the same model through Lightning on different shards of one data set. torch_xla
cannot run collectives between XLA:CPU processes, so the workers carry its all-reduce over gloo
(``helpers/gloo_xla_collectives.py``, whose docstring says what that replaces and what it cannot see). Checked:

1. both replicas end with the same parameters;
2. the parameters moved;
3. they equal a one-process CPU reference in plain PyTorch trained on the concatenation of both shards' batches of
   every step (mean cross-entropy over the concatenated batch = the average of the two replicas' mean losses): a
   reduce that is lost or comes before the backward gives different parameters;
4. (plain Lite) exactly one all-reduce call per optimizer step, over all the gradients. Averaging gradients that
   are already averaged changes nothing numerically, so only this count shows a second reduce.

The Trainer's pair is in ``test_xla_ddp_two_processes_closure_loss.py``: its one all-reduce also carries the
closure's loss, which only the closure-optimizer fix adds.

Without the DDP fix, the Trainer's precision plugin hands its closure to ``xm.optimizer_step``, which all-reduces
the gradients before the closure runs ``backward``: each replica steps with its own gradients and they drift apart.
Lite's ``TPUPrecision`` passes ``optimizer.step(closure)`` to ``xm.optimizer_step`` the same way and has the same
problem; ``optimizer.step()`` after ``self.backward`` was right already (a guard).
"""
import pytest

from helpers.ddp_two_process_pair import check_in_sync, check_one_reduce_per_step, run_pair
from helpers.runif import RunIf

FIXED_BY = "0005-tpu-reduce-gradients-inside-the-closure.patch"


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.guard
def test_lite_step_after_backward_two_processes_stay_in_sync(tmp_path):
    """Lite with ``self.backward(loss); optimizer.step()``: right before the fix too, where ``xm.optimizer_step``
    reduced after the user's backward (a regression guard)."""
    check_one_reduce_per_step(check_in_sync(run_pair("lite", tmp_path)), closure_loss=False)


@RunIf(xla=True)
@pytest.mark.slow
def test_lite_step_with_closure_two_processes_stay_in_sync(tmp_path):
    """Lite with ``optimizer.step(closure)``, the closure running zero_grad, forward and ``self.backward``: the
    gradients must be reduced after the closure's backward, not before it."""
    check_in_sync(run_pair("lite_closure", tmp_path))
