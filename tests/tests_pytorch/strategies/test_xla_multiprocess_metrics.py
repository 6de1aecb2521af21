"""torchmetrics objects sync their states over XLA processes (torchmetrics syncs through ``torch.distributed``,
which the XLA strategies do not initialise). Two processes through the simulated TPU host, Lite's ``XLAStrategy``;
the Trainer's ``self.log`` of a metric is checked in ``test_xla_multiprocess.py``. Before the fix every rank
computed its own value (here 0.5 and 1.125 for a mean of 0.8125)."""
import pytest

from helpers.multiprocess_scenarios import CLASSES, check_identical_sequences, dataset, run_scenario
from helpers.runif import RunIf

FIXED_BY = "0023-xla-torchmetrics-sync-across-replicas.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_metrics_compute_over_every_rank(tmp_path, fork_server):
    import torchmetrics

    result = run_scenario("lite_metrics", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    x, y = dataset().tensors
    everything = slice(0, 16)  # rank 0's 8 rows and rank 1's 8 rows
    accuracy = torchmetrics.classification.MulticlassAccuracy(num_classes=CLASSES, average="micro")
    expected = {
        "mean": float(y[everything].float().mean()),
        "accuracy": float(accuracy(x[everything, :CLASSES] * 10, y[everything])),
    }
    for report in result["ranks"]:
        assert report == pytest.approx(expected, abs=1e-6)
