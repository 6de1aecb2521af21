"""Several XLA processes, as a TPU VM runs them: the real launcher and ``TPUSpawnStrategy``, every collective carried.

Each test runs a scenario of ``helpers/multiprocess_scenarios.py`` in a fresh interpreter that plays a TPU host's main
process: ``Trainer(accelerator="tpu", devices="auto")`` picks ``TPUSpawnStrategy`` for the host's 2 "chips", and the
launcher spawns 2 OS processes, each with its own XLA:CPU device, whose collectives travel over gloo
(``helpers/gloo_xla_collectives.py`` says exactly what it replaces). Every rank's sequence of collectives is recorded
and must be identical on both ranks (a divergence fails at the collective where it happens, instead of hanging), and
the results must equal a one-process run on the same global batches.
"""
import pytest

from helpers.multiprocess_scenarios import check_identical_sequences, max_diff, run_scenario
from helpers.runif import RunIf

FIXED_BY = "0025-xla-synced-step-values-join-the-deferred-transfer.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_fit_with_sync_dist_metrics_and_callbacks_equals_one_process(tmp_path, fork_server):
    """fit with validation: ``sync_dist`` on step and epoch values, a torchmetrics accuracy, ``ModelCheckpoint``
    monitoring it and ``EarlyStopping``. Every rank logs, monitors and decides what one process on all the data does
    (before `xla-torchmetrics-sync-across-replicas` the accuracy was each rank's own; before
    `xla-distributed-sampler-reshuffles-every-epoch` the second epoch repeated the first one's order; before
    `xla-broadcast-sends-the-source-pickle` the checkpoint paths' broadcast failed), the weights equal that run's, and
    a steady step costs what it costs on one device (`xla-synced-step-values-join-the-deferred-transfer`)."""
    result = run_scenario("fit_sync_dist", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    assert result["xla"]["strategy"] == "TPUSpawnStrategy"
    cpu = result["cpu"]
    for rank, report in enumerate(result["ranks"]):
        for key in ("epochs", "stopped", "best_path", "top_k"):
            assert report[key] == cpu[key], (rank, key, report[key], cpu[key])
        assert report["best_score"] == pytest.approx(cpu["best_score"], abs=1e-6), rank
        assert report["metrics"].keys() == cpu["metrics"].keys()
        for name, value in cpu["metrics"].items():
            assert report["metrics"][name] == pytest.approx(value, abs=1e-5), (rank, name)
        assert max_diff(report["params"], cpu["params"]) < 1e-5, rank
    # the main process receives the trained weights
    assert max_diff(result["xla"]["params"], cpu["params"]) < 1e-5
    # what the step's logged values cost: one all-reduce each, inside the step (no mesh_reduce round trip:
    # `xla-sync-dist-reduces-inside-the-step-graph`)
    ops = {entry["op"] for entry in result["records"][0][0]["log"]}
    assert not any("mesh_reduce" in op for op in ops), ops
    # per rank and steady step, beyond what the harness's transport of the collectives costs (a host round trip
    # that a TPU keeps inside the graph): nothing compiles, one graph runs and one transfer brings the logged values,
    # the synced progress-bar loss included (2 executions and 3 transfers before
    # `xla-synced-step-values-join-the-deferred-transfer`)
    for rank, report in enumerate(result["ranks"]):
        steady = report["counts"][2:]
        assert len(steady) >= 5, "too few steps to measure"
        assert steady == [{"compiles": 0, "executions": 1, "transfers": 1}] * len(steady), (rank, steady)


@RunIf(xla=True)
@pytest.mark.slow
@pytest.mark.guard
def test_resume_from_a_checkpoint_equals_an_uninterrupted_run(tmp_path, fork_server):
    """One epoch, then a new Trainer resumes from ``last.ckpt`` (written through ``XLACheckpointIO`` by both ranks):
    the weights equal two epochs in one process on the same global batches, and the checkpoint holds the callback
    state."""
    result = run_scenario("resume", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    assert (result["epoch"], result["global_step"]) == (1, 12)
    assert result["top_k"] == ["epoch=0-step=6.ckpt", "epoch=1-step=12.ckpt"]
    assert max_diff(result["xla"], result["cpu"]) < 1e-5
