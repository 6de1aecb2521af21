"""With several XLA processes (``tpu_spawn``, gloo harness) the batches come from the fork's loader thread, which ends
with the pass (fix `xla-single-device-batches-copied-on-loader-threads`). torch_xla's ``MpDeviceLoader``, which
``tpu_spawn`` used before, starts threads that nothing ends: a worker that stops in the middle of an epoch
(``max_steps``) returns from its function with them still copying batches, and a process that leaves the interpreter
while one of them is inside torch_xla aborts (``terminate called without an active exception``, see
``test_xla_single_device_batches_on_loader_threads.py``)."""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0061-xla-single-device-batches-copied-on-loader-threads.patch"


@pytest.mark.slow  # three spawns of two processes, through the harness
@RunIf(xla=True)
def test_workers_that_stop_mid_epoch_leave_no_loader_thread_and_exit_cleanly(tmp_path, fork_server):
    """Three ``fit`` runs to ``max_steps=3`` of an epoch of 16 batches of 8 MB per process: every worker exits with
    status 0, and no thread its function started is left running when the function returns."""
    from helpers.multiprocess_scenarios import run_scenario, WORLD_SIZE

    runs = run_scenario("stops_mid_epoch", str(tmp_path), timeout=600, fork_server=fork_server)["runs"]
    assert [run["error"] for run in runs] == [None] * 3
    assert [run["exit_codes"] for run in runs] == [[0] * WORLD_SIZE] * 3
    assert [run["threads_left"] for run in runs] == [[[]] * WORLD_SIZE] * 3
