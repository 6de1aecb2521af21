"""The checkpoint benchmark (``make bench-checkpoint``): each row in its own process on a real XLA device, every save
timed on the training thread with its copy to the host inside it, and the result files stamped. Times are measured,
never asserted; what is asserted are the counts and the structure."""
import json

import pytest

from helpers.runif import RunIf


@RunIf(xla=True)
@pytest.mark.slow
def test_every_row_times_every_save_and_the_result_says_what_it_measured(tmp_path, monkeypatch):
    from bench import checkpoint_bench

    monkeypatch.setattr(checkpoint_bench, "RESULTS", tmp_path / "results")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    checkpoint_bench.main(["--rounds", "1", "--steps", "10", "--every", "5", "--width", "64", "--layers", "2",
                           "--tmp", str(tmp_path / "ckpts")])
    data = json.loads((tmp_path / "results" / "checkpoint.json").read_text())
    assert data["stamp"]["fork"].startswith("1.8.6+xla.") and data["stamp"]["digest"]
    (results,) = data["rounds"]
    # the run without checkpoints saves nothing, and its quiet copy is timed
    assert results["none"]["saves"] == [] and results["none"]["quiet_copy_s"] > 0
    for row in ("sync", "background"):
        saves = results[row]["saves"]
        # steps 5 and 10, each timed with the wait for the step and the copy inside it
        assert [s["step"] for s in saves] == [5, 10]
        assert all(0 <= s["wait_s"] and 0 < s["copy_s"] and s["wait_s"] + s["copy_s"] <= s["stall_s"] for s in saves)
        assert results[row]["checkpoint_mb"] > results[row]["state_mb"] * 0.9
        assert results[row]["added_s"] == results[row]["saves"][1]["stall_s"] - results[row]["saves"][1]["wait_s"]
    summary = data["summary"]
    background = summary["background"]
    assert summary["background_added_over_quiet_copy"] == background["added_s"] / background["quiet_copy_s"]
    assert summary["saves"] == 2
    page = (tmp_path / "results" / "checkpoint.md").read_text()
    assert "| 1 | none |" in page and "| 1 | sync |" in page and "| 1 | background |" in page
    assert "target <= 1.5" in page
