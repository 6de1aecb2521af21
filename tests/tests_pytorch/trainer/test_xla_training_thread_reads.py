"""On XLA the training thread never reads from the device in a steady step: the copy of the step's logged values and
running loss to the host is made on Lightning's copying thread, and the results, the progress bar and the loggers
take the values in one step later (fix 0060). Before it, the training thread made that copy right after the step's
barrier, and so waited for the device to finish the step: one read a step in every pattern below.

The reads are counted on the training thread itself (``helpers.xla_waits``), and each count is checked against
torch_xla's own transfer counter, so that a read the count missed fails the test instead of passing it."""
import pytest

from helpers.runif import RunIf
from helpers.xla_waits import check_against_the_device_counters, evaluation_run, pattern_run

FIXED_BY = "0060-xla-host-copies-off-the-training-thread.patch"


def _what(rows):
    return [row["what"] for row in rows]


@RunIf(xla=True)
# the other patterns of `PATTERNS` are counted with the batches' copies too (0061)
@pytest.mark.parametrize("pattern", ["automatic", "manual_two_optimizers", "torchmetrics"])
def test_a_steady_training_step_reads_nothing_on_the_training_thread(pattern, tmp_path):
    rows = pattern_run(pattern, tmp_path)
    assert len(rows) >= 4
    for row in rows:
        check_against_the_device_counters(row)
    assert [row["reads"] for row in rows] == [0] * len(rows), _what(rows)
    # and the step still costs what it cost: no compilation, one graph, at most one transfer (made elsewhere)
    assert {(row["compiles"], row["executions"]) for row in rows} == {(0, 1)}, rows
    assert all(row["transfers_from_device"] <= 1 for row in rows), rows


@RunIf(xla=True)
def test_validation_test_and_predict_steps_read_nothing_on_the_training_thread(tmp_path):
    stages = evaluation_run(tmp_path)
    for stage, rows in stages.items():
        assert len(rows) >= 4, stage
        for row in rows:
            check_against_the_device_counters(row)
        assert [row["reads"] for row in rows] == [0] * len(rows), (stage, _what(rows))
        assert all(row["transfers_from_device"] <= 1 for row in rows), (stage, rows)
