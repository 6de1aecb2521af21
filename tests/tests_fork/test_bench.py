"""The graph benchmark's machinery (bench/): row planning from the series, the loss check, and a tiny real run."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from helpers.runif import RunIf

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _load("graph_bench_under_test", REPO / "bench" / "graph_bench.py")


def test_rows_follow_the_series(bench):
    series = ["0001-a.patch", "0002-b.patch", "0003-c.patch", "0004-d.patch", "0005-e.patch"]
    rows = bench.plan_rows(series, ["compat", "compat", "compat", "fix", "fix"])
    keyed = {r.key: r for r in rows}
    assert [r.key for r in rows][:3] == ["before", "fix-0004", "fork"]
    assert keyed["before"].upto == "0003-c.patch"
    assert keyed["fix-0004"].upto == "0004-d.patch"
    # the series ends with a fix: that row is the full fork, not measured twice
    assert keyed["fork"].upto == "0005-e.patch" and "full fork" in keyed["fork"].label
    assert keyed["lite"].upto == "0005-e.patch" and keyed["cpu-lightning"].upto == "0005-e.patch"
    assert keyed["pl266"].pl266 and keyed["pl266"].upto is None
    # a new fix patch gives a new row without touching the benchmark
    rows = bench.plan_rows(series + ["0006-f.patch"], ["compat"] * 3 + ["fix"] * 3)
    assert [r.key for r in rows][:4] == ["before", "fix-0004", "fix-0005", "fork"]
    # no fix yet: only the fork row
    rows = bench.plan_rows(series[:2], ["compat", "compat"])
    assert [r.key for r in rows][0] == "fork" and rows[0].upto == "0002-b.patch"
    assert "before" not in [r.key for r in rows]
    # the three hand-written loops share one process, every Lightning row gets its own
    groups = bench.group_rows(bench.plan_rows(series, ["compat"] * 3 + ["fix"] * 2))
    assert [[r.key for r in g] for g in groups if len(g) > 1] == [["xla-loop", "xla-loop-noread", "cpu-loop"]]


def test_select_rows_rejects_unknown_keys(bench):
    rows = bench.plan_rows(["0001-a.patch", "0004-d.patch"], ["compat", "fix"])
    assert [r.key for r in bench.select_rows(rows, "cpu-loop,before")] == ["before", "cpu-loop"]
    with pytest.raises(bench.BenchError, match="no row 'nope'"):
        bench.select_rows(rows, "nope")


def test_loss_check_catches_a_row_that_does_not_train(bench):
    rows_mod = bench.bench_rows
    ref = {"last_loss": 2.3163, "steps_done": 8, "steps_planned": 8}
    good = rows_mod.loss_check({"last_loss": 2.31631, "steps_done": 8, "steps_planned": 8}, ref)
    bad = rows_mod.loss_check({"last_loss": 2.3134, "steps_done": 8, "steps_planned": 8}, ref)
    early = rows_mod.loss_check({"last_loss": 2.0, "steps_done": 3, "steps_planned": 8}, ref)
    assert good["ok"] is True
    assert bad["ok"] is False and "does not train" in bad["why"]
    assert early["ok"] is None


@RunIf(xla=True)
def test_paired_reference_is_left_out_of_the_row(bench):
    """A row paired with the hand loop keeps its own counts and time: the paired steps are taken out of both."""
    import torch_xla

    torch_xla.sync()  # nothing left pending by earlier tests in this process
    rows_mod = bench.bench_rows
    size = dict(rows_mod.SIZES["small"], steps=2 * rows_mod.PAIR_BLOCK + 4, warmup=4)
    out = rows_mod.hand_loop(size, "xla", 60, partner=rows_mod.PairedReference(size))
    assert (out["compiles_per_step"], out["executions_per_step"], out["transfers_per_step"]) == (0, 1, 1)
    paired = out["paired"]
    # one whole block of paired steps lies in the steady state (steps 5..24): the one after step 20
    assert paired["steps"] == rows_mod.PAIR_BLOCK and len(paired["block_ratios"]) == 1
    assert paired["reference_counts_per_step"] == [0, 1, 1]
    assert 0 < paired["reference_s_per_step"] and 0 < paired["ratio"]
    # host CPU time of the Python thread: positive, and never more than the wall time it was spent in
    assert 0 < out["host_cpu_s_per_step"] <= out["s_per_step"] * 1.05
    assert 0 < paired["reference_host_cpu_s_per_step"] <= paired["reference_s_per_step"] * 1.05
    assert out["unpaired_why"] is None


@RunIf(xla=True)
def test_a_row_with_pending_device_work_is_not_paired(bench):
    """The paired steps' barrier would run what the row left pending (and change what the row does)."""
    import torch
    import torch_xla

    rows_mod = bench.bench_rows
    size = dict(rows_mod.SIZES["small"], steps=30, warmup=4)
    rec = rows_mod.Recorder(True, size["warmup"], size["steps"], 60, rows_mod.PairedReference(size))
    pending = torch.ones(3, device=torch_xla.device()) * 2  # noqa: F841 - alive, with IR that no barrier ran
    for _ in range(rows_mod.PAIR_BLOCK):
        rec.step_end()
    rec.pair()
    assert rec.partner is None and rec.partner_marks == []
    assert "pending on the device" in rec.unpaired_why and "aten::mul" in rec.unpaired_why
    assert rows_mod.pending_device_work() is not None


@RunIf(xla=True)
def test_tiny_run_of_the_hand_written_loop(bench, tmp_path, capsys):
    out = tmp_path / "results"
    code = bench.main(["--rows", "xla-loop", "--sizes", "small", "--steps", "6", "--warmup", "2",
                       "--out", str(out), "--logs", str(tmp_path / "logs"), "--python", sys.executable])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads((out / "bench.json").read_text())
    (row,) = data["rows"]
    entry = row["sizes"]["small"]
    m = entry["measure"]
    assert row["row"] == "xla-loop" and m["steps_done"] == 6 and m["steady_steps"] == 4
    # the reference loop: nothing compiles after warm-up, one graph per step, one host read of the loss per step
    assert m["compiles_per_step"] == 0
    assert m["executions_per_step"] == 1
    assert m["transfers_per_step"] == 1
    assert m["s_per_step"] > 0 and len(m["step_times"]) == 6
    # too short for a whole block of paired steps: the reference is two runs of the hand loop made after the row
    assert m["paired"] is None and "before a whole block" in m["unpaired_why"]
    assert [run["executions_per_step"] for run in entry["reference"]["runs"]] == [1, 1]
    assert entry["loss_check"]["ok"] is True  # the xla-loop row is the loss reference: this checks the plumbing
    assert entry["ratio_same_process"] > 0
    md = (out / "bench.md").read_text()
    assert "| hand-written PT/XLA loop (reference) † | 0.00 | 1.00 | 1.00 |" in md
    assert "| hand-written PT/XLA loop (reference) † | 0.00 | 1.00 | 1.00 |" in printed


def test_readme_shows_the_tables_of_the_latest_run():
    """The README's benchmark block is exactly what ``make bench`` last wrote to results/bench.md."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("readme_bench", root / "tools" / "readme_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    readme = (root / "README.md").read_text()
    block = readme.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0]
    bench = (root / "results" / "bench.md").read_text()
    tables = [line for line in bench.splitlines() if line.startswith("| ")]
    assert len(tables) > 20
    for line in tables:
        assert line in block, f"README.md is missing a row of results/bench.md: {line[:80]}"


def test_the_driver_checks_every_row_against_the_hand_loop_row(bench):
    def row(key, loss, steps=8):
        return {"row": key, "sizes": {"small": {"measure": {"last_loss": loss, "steps_done": steps,
                                                            "steps_planned": 8}}}}

    results = [row("fork", 2.3163), row("pl266", 2.40), row("before", 9.0, steps=3), row("xla-loop", 2.3163)]
    wrong = bench.apply_loss_checks(results, ["small"])
    assert [(r["row"], s) for r, s in wrong] == [("pl266", "small")]
    checks = {r["row"]: r["sizes"]["small"]["loss_check"] for r in results}
    assert checks["fork"]["ok"] is True and checks["before"]["ok"] is None
    alone = [row("fork", 2.3163)]
    assert bench.apply_loss_checks(alone, ["small"]) == []
    assert alone[0]["sizes"]["small"]["loss_check"]["why"] == "not compared: this run has no xla-loop row"
