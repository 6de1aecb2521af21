"""bench/host_bench.py: the lock-stepped pairs, the rounds and the figures (no test asserts a time)."""
import sys

import pytest
from helpers.runif import RunIf


def _host_bench():
    from bench import host_bench

    return host_bench


def test_rounds_alternate_order_and_first_turn(tmp_path):
    hb = _host_bench()
    calls = []
    fake_ms = {"fork": 4.0, "pl266": 5.0, "lite": 2.0, "hand": 1.5}

    def runner(first, second, paths, steps, warmup, python, log_dir, tag):
        calls.append((tag, first, second))
        return {"median_ms": fake_ms[first]}, {"median_ms": fake_ms[second]}

    result = hb.measure(2, 10, 2, {}, sys.executable, tmp_path, runner=runner)
    pairs = [("fork", "pl266"), ("lite", "pl266"), ("hand", "pl266"), ("fork", "fork"), ("fork", "lite")]
    assert calls[:5] == [("r0", a, b) for a, b in pairs]
    # the second round runs the pairs backwards, each with the other row taking the first turn
    assert calls[5:] == [("r1", b, a) for a, b in reversed(pairs)]
    # whichever row went first, each pair's values stay in (row A, row B) order
    assert result["pairs"]["fork|pl266"] == [(4.0, 5.0), (4.0, 5.0)]
    assert result["pairs"]["lite|pl266"] == [(2.0, 5.0), (2.0, 5.0)]


def test_summary_ratios_differences_targets_and_spread():
    hb = _host_bench()
    result = {"rounds": 3, "steps": 100, "warmup": 10, "pairs": {
        "fork|pl266": [(4.0, 5.0), (8.0, 8.0), (3.0, 4.0)],
        "fork|fork": [(4.0, 4.0), (4.2, 4.0), (3.8, 4.0)],
        "fork|lite": [(4.0, 3.5), (4.0, 3.0), (4.0, 3.6)],
    }}
    s = hb.summarize(result)
    by = {(r["a"], r["b"]): r for r in s["rows"]}
    assert by[("fork", "pl266")]["ratio"] == pytest.approx(0.8)  # median of 0.8, 1.0, 0.75
    assert by[("fork", "lite")]["diff_ms"] == pytest.approx(0.5)
    assert s["aa_spread"] == pytest.approx(0.05)
    assert [t["met"] for t in s["targets"]] == [True, True]
    text = hb.markdown(result, s)
    assert "fork Trainer vs fork Trainer (A/A)" in text and "0.80 (0.80, 1.00, 0.75)" in text


@RunIf(xla=True)
def test_two_workers_take_turns_to_the_end(tmp_path):
    """Two real hand-loop workers in lock-step: both finish, each reports its steady steps."""
    hb = _host_bench()
    a, b = hb.run_pair("hand", "hand", {"hand": None}, 8, 2, sys.executable, tmp_path, "t")
    for res in (a, b):
        assert res["row"] == "hand" and res["steps"] == 5 and res["median_ms"] > 0
        assert res["last_loss"] is not None
