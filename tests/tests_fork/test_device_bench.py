"""bench/device_bench.py: the interleaved rounds, the per-round ratios and their medians, the README's blocks, and a
worker of a few steps. No test asserts a time: only counts and structure."""
import json
import sys
from pathlib import Path

import pytest

from helpers.runif import RunIf

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def db():
    from bench import device_bench

    return device_bench


@pytest.fixture(scope="module")
def rb():
    from forkq import bench_readme

    return bench_readme


def _row(row, ms, loss=2.3, lightning=None, counts=(0.0, 1.0, 1.0)):
    versions = {"torch": "2.9.0", "torch_xla": "2.9.0"}
    if lightning:
        versions["lightning"] = lightning
    return {"row": row, "median_ms": ms, "mean_ms": ms, "steps_done": 10, "steps_planned": 10,
            "counts_per_step": list(counts), "last_loss": loss, "versions": versions, "notes": []}


LIGHTNING = {"idiom": None, "fork": "1.8.6+xla.59.gabc", "fork-aa": "1.8.6+xla.59.gabc", "pl266": "2.6.6"}


def _fake_runner(ms_by_round, calls, losses=None):
    """A runner that records (round, row) and returns the given median per row and round."""

    def runner(row, paths, cfg, python, log):
        r = int(log.name.split("-")[0][1:])
        calls.append((r, row))
        return _row(row, ms_by_round[r][row], loss=(losses or {}).get(row, 2.3), lightning=LIGHTNING[row])

    return runner


CFG = {"layers": [768, 768, 768, 768, 10], "batch": 256, "steps": 10, "warmup": 2, "budget": 60, "timeout": 60}


def test_round_order_alternates(db):
    assert db.round_order(0) == ["idiom", "fork", "pl266", "fork-aa"]
    assert db.round_order(1) == ["fork-aa", "pl266", "fork", "idiom"]
    assert db.round_order(2) == db.round_order(0) and db.round_order(3) == db.round_order(1)


def test_each_round_runs_every_row_once_in_its_order(db, tmp_path):
    ms = [{"idiom": 20.0, "fork": 24.0, "pl266": 30.0, "fork-aa": 24.0}] * 3
    calls = []
    result = db.measure(3, CFG, {}, sys.executable, tmp_path, runner=_fake_runner(ms, calls))
    assert [row for r, row in calls if r == 0] == db.round_order(0)
    assert [row for r, row in calls if r == 1] == db.round_order(1)
    assert [row for r, row in calls if r == 2] == db.round_order(2)
    assert result["order"] == [db.round_order(r) for r in range(3)]
    assert len(result["per_round"]) == 3 and all(set(got) == set(db.ROWS) for got in result["per_round"])


def test_ratios_are_taken_within_a_round_then_the_median(db, tmp_path):
    # the machine is twice as slow in round 1: the ratios within each round do not see it
    ms = [{"idiom": 20.0, "fork": 24.0, "pl266": 30.0, "fork-aa": 24.0},
          {"idiom": 40.0, "fork": 44.0, "pl266": 50.0, "fork-aa": 40.0},
          {"idiom": 20.0, "fork": 26.0, "pl266": 26.0, "fork-aa": 26.0}]
    result = db.measure(3, CFG, {}, sys.executable, tmp_path, runner=_fake_runner(ms, []))
    s = db.summarize(result)
    by = {(q["a"], q["b"]): q for q in s["ratios"]}
    idiom = by[("fork", "idiom")]
    assert idiom["per_round"] == pytest.approx([1.2, 1.1, 1.3])
    assert (idiom["median"], idiom["min"], idiom["max"]) == pytest.approx((1.2, 1.1, 1.3))
    assert idiom["target"] == 1.05 and idiom["met"] is False
    pl266 = by[("fork", "pl266")]
    assert pl266["per_round"] == pytest.approx([0.8, 0.88, 1.0]) and pl266["median"] == pytest.approx(0.88)
    aa = by[("fork", "fork-aa")]
    assert aa["per_round"] == pytest.approx([1.0, 1.1, 1.0]) and aa["target"] is None and aa["met"] is None
    assert s["aa_spread"] == pytest.approx(0.1)
    rows = {r["row"]: r for r in s["rows"]}
    assert rows["fork"]["per_round_ms"] == [24.0, 44.0, 26.0] and rows["fork"]["median"] == 26.0
    assert rows["pl266"]["counts_per_step"] == [0.0, 1.0, 1.0]
    assert s["failures"] == []
    text = db.markdown(result, s, {"pjrt_device": "CPU", "xla_flags": db.SINGLE_THREAD, "versions": {}})
    assert "| fork / idiom | **1.20** | 1.10..1.30 | 1.20, 1.10, 1.30 | 3 of 3 rounds | <= 1.05: NOT met |" in text
    assert "| fork / fork (A/A) | **1.00** | 1.00..1.10 | 1.00, 1.10, 1.00 | 1 of 3 rounds | 1.00 expected |" in text
    assert "median of 8 steps after 2 warm-up steps" in text and "3 rounds" in text


def test_a_failed_or_wrong_row_drops_out_of_that_round_only(db, tmp_path):
    ms = [{"idiom": 20.0, "fork": 24.0, "pl266": 30.0, "fork-aa": 24.0}] * 3
    calls = []
    good = _fake_runner(ms, calls)

    def runner(row, paths, cfg, python, log):
        res = good(row, paths, cfg, python, log)
        if row == "pl266" and log.name.startswith("r1-"):
            return {"row": row, "error": "exit 1; see the log"}
        if row == "pl266" and log.name.startswith("r2-"):
            res["versions"]["lightning"] = "1.8.6+xla.59.gabc"  # the wrong Lightning on its path
        return res

    result = db.measure(3, CFG, {}, sys.executable, tmp_path, runner=runner)
    s = db.summarize(result)
    by = {(q["a"], q["b"]): q for q in s["ratios"]}
    assert by[("fork", "pl266")]["per_round"] == [pytest.approx(0.8), None, None]
    assert (by[("fork", "pl266")]["a_slower"], by[("fork", "pl266")]["rounds"]) == (0, 1)
    assert by[("fork", "idiom")]["per_round"] == pytest.approx([1.2, 1.2, 1.2])
    assert len(s["failures"]) == 2 and "round 2: pl266: exit 1" in s["failures"][0]
    assert "not 2.6.6" in s["failures"][1]


def test_a_row_that_does_not_train_like_the_idiom_is_invalid(db, tmp_path):
    ms = [{"idiom": 20.0, "fork": 10.0, "pl266": 30.0, "fork-aa": 24.0}]
    result = db.measure(1, CFG, {}, sys.executable, tmp_path,
                        runner=_fake_runner(ms, [], losses={"fork": 2.0, "idiom": 2.3}))
    got = result["per_round"][0]
    assert "does not train the same way" in got["fork"]["invalid"]
    assert all("invalid" not in got[r] for r in ("idiom", "pl266", "fork-aa"))
    assert db.summarize(result)["ratios"][0]["median"] is None


def test_worker_env_gives_xla_cpu_one_compute_thread_and_each_row_its_lightning(db):
    paths = {"idiom": None, "fork": "/f/src", "fork-aa": "/f/src", "pl266": "/b/pl266"}
    base = {"PJRT_DEVICE": "CPU", "PYTHONPATH": "/elsewhere", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    env = db.worker_env("idiom", paths, base)
    assert "PYTHONPATH" not in env
    assert env["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x", db.SINGLE_THREAD]
    assert db.worker_env("pl266", paths, base)["PYTHONPATH"] == "/b/pl266"
    again = db.worker_env("fork", paths, dict(base, XLA_FLAGS=db.SINGLE_THREAD))
    assert again["XLA_FLAGS"] == db.SINGLE_THREAD and again["PYTHONPATH"] == "/f/src"
    tpu = db.worker_env("fork", paths, {"PJRT_DEVICE": "TPU"})
    assert "XLA_FLAGS" not in tpu


def _device_json(db, rounds=5, quick=False):
    ms = [{"idiom": 20.0, "fork": 24.0, "pl266": 30.0, "fork-aa": 24.0}] * rounds
    result = {"rounds": rounds, "config": CFG, "order": [],
              "per_round": [{row: _row(row, v, lightning=LIGHTNING[row]) for row, v in m.items()} for m in ms]}
    meta = {"pjrt_device": "CPU", "xla_flags": db.SINGLE_THREAD, "quick": quick, "versions": {}}
    summary = db.summarize(result)
    return {"meta": meta, "result": result, "summary": summary}, db.markdown(result, summary, meta)


def test_readme_blocks_get_the_table_and_the_headline(db, rb):
    device, md = _device_json(db)
    assert rb.device_unpublishable(device) is None
    page = f"intro\n{rb.DEVICE_BEGIN}\nold\n{rb.DEVICE_END}\nend\n"
    new = rb.update_device(page, md)
    block = new.split(rb.DEVICE_BEGIN)[1].split(rb.DEVICE_END)[0]
    assert "| fork / idiom | **1.20** |" in block and "# Device-bound" not in block and "\nold\n" not in block
    top = f"# x\n\n{rb.HEADLINE_BEGIN}\n- old\n{rb.HEADLINE_END}\n"
    line = rb.update_headline(top, device).split(rb.HEADLINE_BEGIN)[1].split(rb.HEADLINE_END)[0]
    flat = " ".join(line.split())
    assert "XLA:CPU with one compute thread" in flat and "median (min..max) of 5 interleaved rounds" in flat
    assert ("idiom (`MpDeviceLoader`, loss read in an async step closure) **1.20** (1.20..1.20; above 1 in 5 of 5 "
            "rounds; target <= 1.05)") in flat
    assert "Lightning 2.6.6 **0.80** (0.80..0.80; above 1 in 0 of 5 rounds; target <= 0.80)" in flat
    assert "(A/A) **1.00** (1.00..1.00; above 1 in 0 of 5 rounds)" in flat
    # the reference: how far below 2.6.6 torch_xla's own loop gets (20 / 30 here)
    assert "torch_xla's idiom / Lightning 2.6.6, the floor of the fork's ratio to 2.6.6 on this host, **0.67**" in flat
    assert "| idiom / Lightning 2.6.6 | **0.67** |" in block and "reference: the floor of fork / 2.6.6 |" in block
    assert all(len(x) <= 118 for x in line.strip().splitlines())
    # both markers are where `fork.py readme-bench` writes
    assert rb.HEADLINE_BEGIN in (REPO / "README.md").read_text() and rb.HEADLINE_END in (REPO / "README.md").read_text()
    bench_readme = (REPO / "bench" / "README.md").read_text()
    assert rb.DEVICE_BEGIN in bench_readme and rb.DEVICE_END in bench_readme


def test_a_smoke_run_or_too_few_rounds_is_never_quoted(db, rb):
    assert "smoke" in rb.device_unpublishable(_device_json(db, rounds=5, quick=True)[0])
    assert "fewer than 5" in rb.device_unpublishable(_device_json(db, rounds=3)[0])


def test_a_row_that_dies_under_the_profiler_is_an_error_row(db, tmp_path):
    """py-spy exits 0 whatever the process it ran did: a row that wrote no result is reported as a failed row, and
    the sweep goes on, instead of the whole benchmark stopping on an empty result file."""
    pyspy = tmp_path / "py-spy"
    pyspy.write_text(f"#!{sys.executable}\nimport subprocess, sys\n"
                     "subprocess.run(sys.argv[sys.argv.index('--') + 1:])\nsys.exit(0)\n")
    pyspy.chmod(0o755)
    cfg = dict(CFG, steps=6, warmup=2, timeout=60, pyspy=str(pyspy))
    res = db.run_row("fork", {"fork": None}, cfg, "/bin/false", tmp_path / "fork.log")
    assert res["row"] == "fork" and res["error"].startswith("no result written (profiled")


def test_a_profiler_that_crashes_is_named_and_its_row_runs_again(db, tmp_path):
    """Under py-spy the process the bench waits for is py-spy: a negative status is the profiler's own death (the
    row's would have given 0), so the error names py-spy, and a round runs that row once more."""
    pyspy = tmp_path / "py-spy"
    pyspy.write_text(f"#!{sys.executable}\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    pyspy.chmod(0o755)
    cfg = dict(CFG, steps=6, warmup=2, timeout=60, pyspy=str(pyspy))
    res = db.run_row("fork", {"fork": None}, cfg, "/bin/false", tmp_path / "fork.log")
    assert res["profiler_failed"] and res["error"].startswith("the profiler (py-spy) itself, not the row, exited -11")
    # without the profiler a row's own status is its error, and nothing is run again
    plain = db.run_row("fork", {"fork": None}, dict(cfg, pyspy=None), "/bin/false", tmp_path / "plain.log")
    assert plain["error"].startswith("exit 1;") and not plain["profiler_failed"]

    calls = []

    def runner(row, paths, cfg, python, log):
        calls.append((row, log.name))
        if row == "fork" and len([c for c in calls if c[0] == "fork"]) == 1:
            return {"row": row, "error": "the profiler (py-spy) itself, not the row, exited -11", "profiler_failed": True}
        return _row(row, 10.0, lightning=LIGHTNING[row])

    result = db.measure(1, dict(CFG), {}, sys.executable, tmp_path / "logs", rows=("idiom", "fork"), runner=runner,
                        pl266_version="2.6.6")
    assert [c for c in calls if c[0] == "fork"] == [("fork", "r0-fork.log"), ("fork", "r0-fork-again.log")]
    got = result["per_round"][0]["fork"]
    assert got["median_ms"] == 10.0 and "profiler_failed_before" in got


@RunIf(xla=True)
def test_idiom_worker_runs_a_few_steps(db, tmp_path):
    """The idiom row in its own process, as a round runs it (small model, 6 steps): it finishes, every step shows its
    loss, and the steady steps cost one execution and one (asynchronous) transfer each."""
    cfg = dict(CFG, layers=[64, 128, 10], batch=32, steps=6, warmup=2, timeout=120)
    log = tmp_path / "idiom.log"
    res = db.run_row("idiom", {"idiom": None}, cfg, sys.executable, log)
    assert "error" not in res, log.read_text()[-3000:]
    assert db.check_row(res, "2.6.6") is None
    assert res["steps_done"] == 6 and res["steady_steps"] == 4 and res["median_ms"] > 0
    compiles, executions, transfers = res["counts_per_step"]
    assert (compiles, executions) == (0.0, 1.0)
    # one read a step, on the closure thread after its step; the window's ends wait for the closures issued so far
    assert round(transfers * res["steady_steps"]) == 4
    assert res["last_loss"] is not None
    assert sum(line.startswith("step ") for line in log.read_text().splitlines()) == 6
    if res["pjrt_device"] == "CPU":
        assert db.SINGLE_THREAD in res["xla_flags"].split()


RAW_PROFILE = """thread (11): MainThread;<module> (device_bench.py:500);main (device_bench.py:480) 7
thread (11): MainThread;worker (device_bench.py:120);idiom_row (device_bench.py:95);host_work (bench_rows.py:50) 50
thread (11): MainThread;worker (device_bench.py:120);idiom_row (device_bench.py:98);step_barrier (bench_rows.py:90);sync (torch_xla.py:1) 30
thread (11): MainThread;worker (device_bench.py:120);idiom_row (device_bench.py:92);__next__ (parallel_loader.py:30);get (queue.py:180);wait (threading.py:320) 15
thread (11);worker (device_bench.py:120);idiom_row (device_bench.py:98);step_barrier (bench_rows.py:90);mark_step (xla_model.py:1);wait (threading.py:320) 5
thread (12): pl-xla-host-copies;_bootstrap (threading.py:1002);run (threading.py:982);get (queue.py:180);wait (threading.py:320) 99
not a sample line
"""


def test_blocked_share_counts_the_training_threads_waits_outside_the_barrier(db):
    """Only the main thread's samples inside the row's training count: 100 of them; 15 wait on a queue outside the
    barrier, 35 are in the barrier (a wait inside it is the barrier's); the copying thread's waits are not the
    training thread's."""
    share = db.blocked_share(RAW_PROFILE)
    assert share == {"samples": 100, "blocked": 0.15, "barrier": 0.35}
    assert db.blocked_share("") == {"samples": 0, "blocked": None, "barrier": None}


def test_the_sweep_table_gives_each_point_its_ratios_and_blocked_shares(db, tmp_path):
    points = []
    for host_ms, fork_ms in ((0.0, 21.0), (20.0, 31.0)):
        calls = []
        ms = [{"idiom": 20.0, "fork": fork_ms, "pl266": 25.0, "fork-aa": fork_ms}] * 2

        def runner(row, paths, cfg, python, log, _inner=_fake_runner(ms, calls)):
            res = _inner(row, paths, cfg, python, log)
            res["profile"] = {"samples": 100, "blocked": 0.1 if row == "pl266" else 0.0, "barrier": 0.5}
            return res

        got = db.measure(2, dict(CFG, host_ms=host_ms), {}, "python", tmp_path / f"p{host_ms:g}", runner=runner,
                         pl266_version="2.6.6")
        points.append({"host_ms": host_ms, "result": got, "summary": db.summarize(got)})
    table = db.sweep_markdown(points).splitlines()
    assert table[-2] == ("| 0 | 20.0 | 21.0 | 25.0 | 1.05 (1.05..1.05) | 0.84 (0.84..0.84) | 0.80 (0.80..0.80) | 0.00 "
                         "| 0% / 0% / 10% | 50% / 50% / 50% |")
    assert table[-1].startswith("| 20 | 20.0 | 31.0 | 25.0 | 1.55 (1.55..1.55) |")
    # a row that died in a round (py-spy itself can crash) is named under the table, with why
    points[1]["result"]["per_round"][1]["fork-aa"] = {"row": "fork-aa", "error": "exit -11; see r1-fork-aa.log"}
    table = db.sweep_markdown(points).splitlines()
    assert table[-3:] == ["Rows that failed, left out of their round's ratios:", "",
                          "- 20 ms, round 2: fork-aa: exit -11; see r1-fork-aa.log"]
