"""The graph benchmark's machinery (bench/): row planning from the series, the loss check, and a tiny real run."""
import argparse
import json
import sys
from pathlib import Path

import pytest

from bench import bench_rows, graph_bench, patterns, report, spmd_bench
from forkq import stamp as fork_stamp
from helpers.runif import RunIf

REPO = Path(__file__).resolve().parents[2]


def test_rows_follow_the_series():
    series = ["0001-a.patch", "0002-b.patch", "0003-c.patch", "0004-d.patch", "0005-e.patch"]
    rows = graph_bench.plan_rows(series, ["compat", "compat", "compat", "fix", "fix"])
    keyed = {r.key: r for r in rows}
    assert [r.key for r in rows][:3] == ["before", "fix-0004", "fork"]
    assert keyed["before"].upto == "0003-c.patch"
    assert keyed["fix-0004"].upto == "0004-d.patch"
    # the series ends with a fix: that row is the full fork, not measured twice
    assert keyed["fork"].upto == "0005-e.patch" and "full fork" in keyed["fork"].label
    assert keyed["lite"].upto == "0005-e.patch" and keyed["cpu-lightning"].upto == "0005-e.patch"
    assert keyed["pl266"].pl266 and keyed["pl266"].upto is None
    # a new fix patch gives a new row without touching the benchmark
    rows = graph_bench.plan_rows(series + ["0006-f.patch"], ["compat"] * 3 + ["fix"] * 3)
    assert [r.key for r in rows][:4] == ["before", "fix-0004", "fix-0005", "fork"]
    # no fix yet: only the fork row
    rows = graph_bench.plan_rows(series[:2], ["compat", "compat"])
    assert [r.key for r in rows][0] == "fork" and rows[0].upto == "0002-b.patch"
    assert "before" not in [r.key for r in rows]
    # the three hand-written loops share one process, every Lightning row gets its own
    groups = graph_bench.group_rows(graph_bench.plan_rows(series, ["compat"] * 3 + ["fix"] * 2))
    assert [[r.key for r in g] for g in groups if len(g) > 1] == [["xla-loop", "xla-loop-noread", "cpu-loop"]]


def test_select_rows_rejects_unknown_keys():
    rows = graph_bench.plan_rows(["0001-a.patch", "0004-d.patch"], ["compat", "fix"])
    assert [r.key for r in graph_bench.select_rows(rows, "cpu-loop,before")] == ["before", "cpu-loop"]
    with pytest.raises(graph_bench.BenchError, match="no row 'nope'"):
        graph_bench.select_rows(rows, "nope")


def test_loss_check_catches_a_row_that_does_not_train():
    rows_mod = bench_rows
    ref = {"last_loss": 2.3163, "steps_done": 8, "steps_planned": 8}
    good = rows_mod.loss_check({"last_loss": 2.31631, "steps_done": 8, "steps_planned": 8}, ref)
    bad = rows_mod.loss_check({"last_loss": 2.3134, "steps_done": 8, "steps_planned": 8}, ref)
    early = rows_mod.loss_check({"last_loss": 2.0, "steps_done": 3, "steps_planned": 8}, ref)
    assert good["ok"] is True
    assert bad["ok"] is False and "does not train" in bad["why"]
    assert early["ok"] is None


@RunIf(xla=True)
def test_paired_reference_is_left_out_of_the_row():
    """A row paired with the hand loop keeps its own counts and time: the paired steps are taken out of both."""
    import torch_xla

    torch_xla.sync()  # nothing left pending by earlier tests in this process
    rows_mod = bench_rows
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
def test_a_row_with_pending_device_work_is_not_paired():
    """The paired steps' barrier would run what the row left pending (and change what the row does)."""
    import torch
    import torch_xla

    rows_mod = bench_rows
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
def test_tiny_run_of_the_hand_written_loop(tmp_path, capsys):
    out = tmp_path / "results"
    code = graph_bench.main(["--rows", "xla-loop", "--sizes", "small", "--steps", "6", "--warmup", "2",
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
    # the run says what it measured: the series now in patches/1.8.6, in the JSON and under the page's title
    assert data["stamp"]["digest"] == fork_stamp.current_digest() and data["stamp"]["date"]
    assert md.splitlines()[:3] == ["# Graph benchmark", "", fork_stamp.line(data["stamp"])]
    assert "| hand-written PT/XLA loop (reference) † | 0.00 | 1.00 | 1.00 |" in printed


def test_readme_shows_the_tables_of_the_latest_run_when_it_measured_this_series():
    """bench/README.md's benchmark blocks hold exactly what ``make bench`` last wrote to results/bench.md when that run
    measured the series now in patches/1.8.6, and a line that says they are not current otherwise."""
    mod = _readme_bench()
    readme = (REPO / "bench" / "README.md").read_text()
    bench = (REPO / "results" / "bench.md").read_text()
    why = mod.why_stale(json.loads((REPO / "results" / "bench.json").read_text()), "bench",
                        fork_stamp.current_digest())
    main, patterns = mod.split_bench(bench)
    for body, begin, end in ((main, mod.BEGIN, mod.END), (patterns, mod.PATTERNS_BEGIN, mod.PATTERNS_END)):
        block = readme.split(begin, 1)[1].split(end, 1)[0]
        if why is not None:
            assert block.strip() == mod.not_current("bench", why)
            continue
        if body is None:
            continue
        for line in [line for line in body.splitlines() if line.startswith("| ")]:
            assert line in block, f"bench/README.md's {begin} block is missing a row of results/bench.md: {line[:80]}"
    assert main is not None and len([line for line in main.splitlines() if line.startswith("| ")]) > 20


def test_the_driver_checks_every_row_against_the_hand_loop_row():
    def row(key, loss, steps=8):
        return {"row": key, "sizes": {"small": {"measure": {"last_loss": loss, "steps_done": steps,
                                                            "steps_planned": 8}}}}

    results = [row("fork", 2.3163), row("pl266", 2.40), row("before", 9.0, steps=3), row("xla-loop", 2.3163)]
    wrong = graph_bench.apply_loss_checks(results, ["small"])
    assert [(r["row"], s) for r, s in wrong] == [("pl266", "small")]
    checks = {r["row"]: r["sizes"]["small"]["loss_check"] for r in results}
    assert checks["fork"]["ok"] is True and checks["before"]["ok"] is None
    alone = [row("fork", 2.3163)]
    assert graph_bench.apply_loss_checks(alone, ["small"]) == []
    assert alone[0]["sizes"]["small"]["loss_check"]["why"] == "not compared: this run has no xla-loop row"


# --------------------------------------------------------------------------------------------- the pattern table
def test_pattern_rows_are_planned_pattern_by_pattern():
    keys = [p.key for p in patterns.PATTERNS]
    rows = graph_bench.plan_pattern_rows("all", "all", "0010-j.patch")
    assert [(r.pattern, r.column) for r in rows] == [(k, c) for k in keys for c in ("fork", "pl266", "hand")]
    assert all(r.kind == "pattern" for r in rows)
    by = {(r.pattern, r.column): r for r in rows}
    # the fork column imports the whole series, 2.6.6 its own folder, the hand loops no Lightning
    assert by["bf16", "fork"].upto == "0010-j.patch" and not by["bf16", "fork"].pl266
    assert by["bf16", "pl266"].pl266 and by["bf16", "pl266"].upto is None
    assert by["bf16", "hand"].upto is None and not by["bf16", "hand"].pl266
    assert len({r.key for r in rows}) == len(rows)
    # every Lightning cell gets its own process, the hand-written loops share one
    groups = graph_bench.group_rows(rows)
    shared = [g for g in groups if len(g) > 1]
    assert [[r.column for r in g] for g in shared] == [["hand"] * len(keys)]
    assert len(groups) == 1 + 2 * len(keys)
    # a choice of patterns and columns keeps the table order
    some = graph_bench.plan_pattern_rows("bf16,log-loss", "hand,fork", "x")
    assert [(r.pattern, r.column) for r in some] == [("bf16", "fork"), ("bf16", "hand"), ("log-loss", "fork"),
                                                      ("log-loss", "hand")]
    assert graph_bench.plan_pattern_rows("none", "all", "x") == []
    with pytest.raises(graph_bench.BenchError, match="no pattern 'nope'"):
        graph_bench.plan_pattern_rows("nope", "all", "x")
    with pytest.raises(graph_bench.BenchError, match="no column 'gpu'"):
        graph_bench.plan_pattern_rows("all", "fork,gpu", "x")
    # the whole table by default, none when --rows names rows, as --patterns says otherwise
    assert graph_bench.wanted_patterns("all", None) == "all" and graph_bench.wanted_patterns("none", None) == "all"
    assert graph_bench.wanted_patterns("xla-loop,fork", None) == "none"
    assert graph_bench.wanted_patterns("fork", "bf16") == "bf16"
    # the main rows can be left out, the pattern table run alone
    assert graph_bench.select_rows(graph_bench.plan_rows(["0001-a.patch", "0004-d.patch"], ["compat", "fix"]), "none") == []


def test_pattern_steps():
    def cfg(*argv):
        parser_args = argparse.Namespace(quick=False, pattern_steps=None)
        for k, v in zip(argv[::2], argv[1::2]):
            setattr(parser_args, k, v)
        return graph_bench.pattern_config(parser_args)

    assert cfg() == {"steps": 60, "warmup": 20}
    # --quick: one whole block of paired steps (after step 20) still falls in the steady state
    assert cfg("quick", True) == {"steps": 26, "warmup": 6}
    assert cfg("pattern_steps", "40,10") == {"steps": 40, "warmup": 10}
    assert cfg("pattern_steps", "30") == {"steps": 30, "warmup": 10}
    with pytest.raises(graph_bench.BenchError):
        cfg("pattern_steps", "5,4")


def _pattern_entry(c, e, t, ratio=1.5, paired=True, pending=0, **extra):
    m = {"compiles_per_step": c, "executions_per_step": e, "transfers_per_step": t, "pending_ir_max": pending,
         "paired": {"ratio": ratio} if paired else None, "note": None}
    m.update(extra)
    return {"measure": m, "ratio_same_process": ratio}


def _pattern_result(pattern, column, entry):
    return {"row": f"pattern-{column}-{pattern}", "label": f"{pattern} ({column})", "kind": "pattern",
            "pattern": pattern, "column": column, "notes": [], "sizes": {"pattern": entry}}


def test_the_fork_targets_of_a_pattern():
    targets = patterns.target_failures
    assert targets("log-loss", _pattern_entry(0, 1, 1)["measure"]) == []
    assert targets("val-metric", _pattern_entry(0, 1, 0)["measure"]) == []
    assert targets("metric-step-epoch", _pattern_entry(0, 7, 7)["measure"]) == [
        "7.00 executions per step (target 1)", "7.00 transfers per step (target at most 1)"]
    assert targets("val-metric", _pattern_entry(0.5, 0, 0)["measure"]) == [
        "0.50 compilations per validation batch after warm-up (target 0)",
        "0.00 executions per validation batch (target 1)"]
    # accumulation: one execution per batch is not enough when the accumulating batch's graph is left pending
    missed = targets("accumulate", _pattern_entry(0, 1, 1, pending=120)["measure"])
    assert len(missed) == 1 and "120 IR nodes left pending between batches" in missed[0]
    assert targets("log-loss", _pattern_entry(0, 1, 1, pending=120)["measure"]) == []
    # bf16: the counts are not enough either
    assert targets("bf16", _pattern_entry(0, 1, 1, checks={"bf16_in_step_graph": False})["measure"]) == [
        "no bf16 in the step graph: it trains in fp32 (target: bf16)"]
    assert targets("bf16", _pattern_entry(0, 1, 1, checks={"bf16_in_step_graph": True})["measure"]) == []


def test_pattern_table_formatting():
    results = [
        _pattern_result("metric-step-epoch", "fork", _pattern_entry(0, 7, 7, ratio=2.61)),
        _pattern_result("metric-step-epoch", "pl266", _pattern_entry(0, 1, 2, ratio=1.78)),
        _pattern_result("metric-step-epoch", "hand", {"measure": _pattern_entry(0, 1, 1)["measure"],
                                                      "ratio_same_process": None}),
        _pattern_result("bf16", "fork", _pattern_entry(0, 1, 1, ratio=2.18, checks={"bf16_in_step_graph": False})),
        _pattern_result("bf16", "pl266", _pattern_entry(0, 1, 2, ratio=0.96, paired=False, pending=3,
                                                        checks={"bf16_in_step_graph": True})),
        _pattern_result("bf16", "hand", {"error": "RuntimeError: boom\nmore"}),
    ]
    lines = report.pattern_table(results, ["fork", "pl266", "hand"]).splitlines()
    assert lines[0] == (
        "| pattern | counted per | fork: compiles / executions / transfers | fork × hand loop (paired) | fork: targets "
        "| Lightning 2.6.6: compiles / executions / transfers | Lightning 2.6.6 × hand loop (paired) "
        "| hand-written loop: compiles / executions / transfers "
        "| IR left pending between steps (fork / Lightning 2.6.6 / hand-written loop) | bf16 in the step graph |")
    assert lines[1] == "|" + "---|" * 10
    # table order is the order of bench/patterns.py, whatever order the results came in
    metric, bf16 = lines[2], lines[3]
    assert metric.startswith("| + `self.log(\"acc\", self.acc, on_step=True, on_epoch=True)`")
    assert ("| step | 0.00 / 7.00 / 7.00 | 2.61 | NOT MET: 7.00 executions per step (target 1); 7.00 transfers per "
            "step (target at most 1) | 0.00 / 1.00 / 2.00 | 1.78 | 0.00 / 1.00 / 1.00 | 0 / 0 / 0 |  |") in metric
    assert ("| step | 0.00 / 1.00 / 1.00 | 2.18 | NOT MET: no bf16 in the step graph: it trains in fp32 (target: bf16) "
            "| 0.00 / 1.00 / 2.00 | 0.96 † | FAILED: RuntimeError: boom | 0 / 3 / - | no / yes / - |") in bf16
    # only the columns that were run
    hand_only = report.pattern_table([r for r in results if r["column"] == "hand"], ["hand"]).splitlines()
    assert hand_only[0].count("|") == 6 and "| 0.00 / 1.00 / 1.00 | 0 |" in hand_only[2]


def test_pattern_section_and_its_notes():
    meta = {"pjrt_device": "CPU", "versions": {"torch": "2.9.0", "torch_xla": "2.9.0"}, "date": "2026-11-30 06:00",
            "pattern_config": {"steps": 26, "warmup": 6}, "pattern_columns": ["fork", "pl266"]}
    unpaired = _pattern_entry(0, 0, 0, paired=False)
    unpaired["measure"]["unpaired_why"] = "not paired: after step 10 the row had work pending on the device"
    results = [_pattern_result("val-metric", "fork", _pattern_entry(0, 5, 5)),
               dict(_pattern_result("val-metric", "pl266", unpaired), notes=["2.6.6 was told it has a device"]),
               dict(_pattern_result("log-loss", "pl266", _pattern_entry(0, 1, 2)),
                    notes=["2.6.6 was told it has a device"])]
    text = "\n".join(report.pattern_section(results, meta))
    assert text.startswith(report.PATTERN_SECTION)
    assert "PJRT_DEVICE=CPU, torch 2.9.0, torch_xla 2.9.0, 2026-11-30 06:00" in text
    assert "26 steps (or batches), counted over the steady state after 6 warm-up steps" in text
    # a note that every 2.6.6 row carries is given once
    assert text.count("2.6.6 was told it has a device") == 1
    assert "- val-metric (pl266): † not paired: after step 10" in text


def _readme_bench():
    from forkq import bench_readme

    return bench_readme


def test_readme_gets_each_table_in_its_block():
    mod = _readme_bench()
    assert mod.PATTERN_HEADING == report.PATTERN_SECTION
    readme = ("intro\n<!-- bench:begin -->\nold main\n<!-- bench:end -->\nmiddle\n<!-- bench-patterns:begin -->\n"
              "old patterns\n<!-- bench-patterns:end -->\nend\n")
    main = "# Graph benchmark\n\nPJRT_DEVICE=CPU ...\n\n## small MLP\n\n| row | a |\n|---|---|\n| fork | 1 |\n"
    pat = "## Everyday patterns: counts\n\n| pattern | b |\n|---|---|\n| bf16 | 2 |\n\n### Notes on the patterns\n\n- x\n"
    both = mod.update_readme(readme, main + "\n" + pat)
    main_block = both.split(mod.BEGIN)[1].split(mod.END)[0]
    pattern_block = both.split(mod.PATTERNS_BEGIN)[1].split(mod.PATTERNS_END)[0]
    assert "### small MLP" in main_block and "| fork | 1 |" in main_block and "bf16" not in main_block
    assert "Graph benchmark" not in both
    assert "\n#### Everyday patterns: counts" in pattern_block and "\n##### Notes on the patterns" in pattern_block
    assert "| bf16 | 2 |" in pattern_block and "| fork | 1 |" not in pattern_block
    assert both.startswith("intro\n") and "\nmiddle\n" in both and both.endswith("end\n")
    # a run without the pattern table leaves the pattern block alone, and the other way round
    main_only = mod.update_readme(readme, main)
    assert "old patterns" in main_only and "old main" not in main_only
    patterns_only = mod.update_readme(readme, "# Graph benchmark\n\n" + pat)
    assert "old main" in patterns_only and "old patterns" not in patterns_only
    with pytest.raises(mod.ReadmeError, match="bench-patterns"):
        mod.update_readme(readme.replace("<!-- bench-patterns:end -->", ""), pat)


@RunIf(xla=True)
def test_tiny_run_of_the_pattern_table(tmp_path, capsys):
    """The pattern table end to end, with the hand-written loops only (no Lightning process): plumbing, not targets."""
    out = tmp_path / "results"
    code = graph_bench.main(["--rows", "none", "--patterns", "log-loss,val-metric", "--pattern-columns", "hand",
                       "--pattern-steps", "8,3", "--out", str(out), "--logs", str(tmp_path / "logs"),
                       "--python", sys.executable])
    printed = capsys.readouterr().out
    assert code == 0, printed
    data = json.loads((out / "bench.json").read_text())
    assert data["rows"] == [] and data["meta"]["pattern_config"] == {"steps": 8, "warmup": 3}
    by = {r["pattern"]: r["sizes"]["pattern"]["measure"] for r in data["patterns"]}
    assert set(by) == {"log-loss", "val-metric"}
    assert (by["log-loss"]["executions_per_step"], by["log-loss"]["transfers_per_step"]) == (1, 1)
    assert (by["val-metric"]["executions_per_step"], by["val-metric"]["transfers_per_step"]) == (1, 0)
    assert by["log-loss"]["steps_done"] == 8 and by["log-loss"]["pending_ir_max"] == 0
    md = (out / "bench.md").read_text()
    assert "| row |" not in md and report.PATTERN_SECTION in md
    assert "| validation batch | 0.00 / 1.00 / 0.00 | 0 |" in md
    assert (tmp_path / "logs" / "pattern-hand-loops.log").exists()


def test_spmd_bench_tables():
    """The SPMD benchmark's tables: one line per row with its counts, bytes per device relative to data parallel."""
    spmd = spmd_bench
    meta = {"devices": 4, "device_type": "CPU", "torch": "2.9.0", "torch_xla": "2.9.0", "steps": 40, "warm_up": 10,
            "batch": 64, "small": [64, 128, 10], "wide": [512, 2048, 512], "wide_params": 10}
    rows = [{"row": "hand", "compiles": 0, "executions": 1, "transfers": 1, "s_per_step": 0.0029}]
    memory = [{"strategy": "xla_spmd", "bytes_device0": 4 * 2 ** 20},
              {"strategy": "xla_spmd_fsdp", "bytes_device0": 2 ** 20}]
    text = spmd.markdown(meta, rows, memory)
    assert "| hand | 0.00 | 1.00 | 1.00 | 2.9 |" in text
    assert "| `xla_spmd` | 4.0 | 1.000 |" in text and "| `xla_spmd_fsdp` | 1.0 | 0.250 |" in text
