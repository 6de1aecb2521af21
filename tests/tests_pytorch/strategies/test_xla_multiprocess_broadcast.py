"""``broadcast`` over XLA processes sends the source rank's object, whatever the other ranks hold.

Two processes through the simulated TPU host of ``helpers/gloo_xla_collectives.py``, Lite's ``XLAStrategy``. Before
the fix every rank's ``torch.save`` pickle was all-gathered (different lengths: different shapes) and loaded with
``torch.load``, which refuses a ``pathlib.Path`` under torch >= 2.6 ("Unsupported global: GLOBAL
pathlib.PosixPath"); ``src`` was ignored.
"""
import pytest

from helpers.multiprocess_scenarios import check_identical_sequences, run_scenario
from helpers.runif import RunIf

FIXED_BY = "0020-xla-broadcast-sends-the-source-pickle.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_broadcast_of_objects_that_differ_between_ranks(tmp_path, fork_server):
    result = run_scenario("lite_broadcast", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    for report in result["ranks"]:
        assert report["path"] == "/tmp/x"
        assert report["from_1"] == {"rank": 1, "items": list(range(10))}
