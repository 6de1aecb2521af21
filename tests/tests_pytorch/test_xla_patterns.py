"""Everyday TPU patterns at one graph per step: the fork's targets, pattern by pattern.

The patterns are those of the benchmark's pattern table, from the one definition in ``bench/patterns.py``, measured
by the benchmark's own code (``bench/bench_rows.py``: the same Recorder, counted over the steady state after the
warm-up). Targets, per training step (accumulation: per batch; validation: per validation batch): 0 compilations after
warm-up, exactly 1 graph execution, at most 1 device-to-host transfer; with accumulation nothing is left pending on
the device between batches (the next graph would compute it again); with ``precision="bf16"`` the step graph computes
in bfloat16. The hand-written PT/XLA loop of every pattern meets the same targets (the last test), so they are
reachable.
"""
import gc
from pathlib import Path

import pytest

from bench import bench_rows, patterns
from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

# the checkout's root, where the fresh interpreter imports the benchmark's package from
REPO = Path(__file__).resolve().parents[2]
STEPS, WARMUP = 12, 4
SIZE = dict(bench_rows.SIZES["pattern"], steps=STEPS, warmup=WARMUP)


def _clean_device():
    """Nothing pending from earlier tests of this worker: the pending-IR check counts every live XLA tensor."""
    import torch_xla

    gc.collect()
    torch_xla.sync()


def _assert_targets(key, m):
    per = patterns.get(key).per
    counts = (m["compiles_per_step"], m["executions_per_step"], m["transfers_per_step"])
    # every miss at once, with the numbers (compilations / executions / transfers per step, pending IR, bf16)
    missed = patterns.target_failures(key, m)
    assert not missed, f"{key}: c/e/t per {per} = {counts}; " + "; ".join(missed)
    assert m["compiles_per_step"] == 0, f"{key}: compilations after warm-up, per {per} (c/e/t {counts})"
    assert m["executions_per_step"] == 1, f"{key}: graph executions per {per} (c/e/t {counts})"
    assert m["transfers_per_step"] <= 1, f"{key}: device-to-host transfers per {per} (c/e/t {counts})"


@RunIf(xla=True)
@pytest.mark.parametrize("key", [p.key for p in patterns.PATTERNS if p.key != "bf16"])
def test_pattern_runs_one_graph_per_step(key):
    _clean_device()
    m = bench_rows.pattern_lightning_run(key, SIZE, budget_s=120)
    assert m["steps_done"] == STEPS and m["steady_steps"] == STEPS - WARMUP
    _assert_targets(key, m)
    if key == "accumulate":
        # the accumulating batch's graph ran at its own barrier: nothing of it is left for the update's graph to redo
        assert m["pending_ir_max"] == 0
        assert m["global_step"] == STEPS // 2


@RunIf(xla=True)
def test_bf16_pattern_computes_in_bf16_with_one_graph_per_step(fork_server):
    """``precision="bf16"`` in a fresh process where the Trainer is the first to use the XLA device, as in a user's
    script: the loss's graph holds bf16, with the same counts as the other patterns."""
    code = f"""
        from bench import bench_rows as rows
        m = rows.pattern_lightning_run("bf16", dict(rows.SIZES["pattern"], steps={STEPS}, warmup={WARMUP}), 120)
        emit({{k: m[k] for k in ("compiles_per_step", "executions_per_step", "transfers_per_step", "steps_done",
                                "checks", "pending_ir_max", "last_loss")}})
    """
    m = run_python(code, env={"PJRT_DEVICE": "CPU"}, timeout=240, cwd=str(REPO), fork_server=fork_server)
    assert m["steps_done"] == STEPS
    _assert_targets("bf16", m)
    assert m["checks"].get("bf16_in_step_graph") is True


@RunIf(xla=True)
def test_hand_written_loops_meet_the_targets():
    """The targets are what a hand-written PT/XLA loop of each pattern costs (and the bf16 check sees its bf16)."""
    _clean_device()
    for p in patterns.PATTERNS:
        m = bench_rows.pattern_hand_run(p.key, SIZE, budget_s=120)
        _assert_targets(p.key, m)
        expected_transfers = 0 if p.key == "val-metric" else 1
        assert m["transfers_per_step"] == expected_transfers, p.key
        assert m["pending_ir_max"] == 0, p.key
