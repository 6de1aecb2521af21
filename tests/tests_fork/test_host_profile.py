"""bench/host_profile.py: exclusive section times, the sections each row finds, the table (no test asserts a time)."""
import sys
import types

import pytest
from helpers.runif import RunIf


@pytest.fixture(scope="module")
def hp():
    from bench import host_profile

    return host_profile


class ScriptedClock:
    """Each reading advances by the next of ``steps``: a deterministic clock for the timer."""

    def __init__(self, *steps: float):
        self.now, self.steps = 0.0, list(steps)

    def __call__(self) -> float:
        self.now += self.steps.pop(0)
        return self.now


def test_a_section_counts_its_time_without_the_sections_it_calls(hp):
    # readings: outer start 1; inner start 2, end 5 (inner took 3); inner start 9, end 10 (took 1); outer end 20
    clock = ScriptedClock(1, 1, 3, 4, 1, 10)
    s = hp.Sections(clock)
    inner = s.timed("inner", lambda: None)

    def body():
        inner()
        inner()

    outer = s.timed("outer", body)
    outer()  # off: nothing is timed, and the clock is not read
    assert s.seconds == {} and s.calls == {}
    s.on = True
    outer()
    assert s.calls == {"outer": 1, "inner": 2}
    assert s.seconds["inner"] == 4  # 3 + 1
    assert s.seconds["outer"] == 19 - 4  # 20 - 1, less the inner calls
    assert clock.steps == []


def test_a_section_that_raises_is_still_counted(hp):
    s = hp.Sections(ScriptedClock(1, 2))
    s.on = True

    def fails():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        s.timed("f", fails)()
    assert s.seconds == {"f": 2} and s._stack == []


def test_calls_on_other_threads_are_not_timed(hp):
    """Lightning's loader and copying threads call timed functions too: their calls must not land on the training
    thread's stack (a section of the training thread went below zero when they did)."""
    import threading

    clock = ScriptedClock(1, 1)  # read by the training thread's one call only
    s = hp.Sections(clock)
    s.on = True
    timed = s.timed("f", lambda: None)
    other = threading.Thread(target=timed)
    other.start()
    other.join()
    assert s.calls == {} and s._stack == []
    timed()
    assert s.calls == {"f": 1} and s.seconds == {"f": 1} and clock.steps == []


def test_resolve_finds_methods_where_they_are_defined_only(hp, monkeypatch):
    mod = types.ModuleType("hp_fake_mod")

    class Base:
        def step(self):
            return "base"

    class Child(Base):
        pass

    mod.Base, mod.Child, mod.func = Base, Child, lambda: None
    monkeypatch.setitem(sys.modules, "hp_fake_mod", mod)
    assert hp.resolve("hp_fake_mod:Base.step") == (Base, "step")
    assert hp.resolve("hp_fake_mod:Child.step") is None  # inherited: wrapping it again would count it twice
    assert hp.resolve("hp_fake_mod:func") == (mod, "func")
    assert hp.resolve("hp_fake_mod:Missing.step") is None
    assert hp.resolve("hp_no_such_module_here:X.y") is None


def test_install_wraps_every_candidate_and_names_an_empty_section(hp, monkeypatch):
    mod = types.ModuleType("hp_fake_mod2")

    class A:
        def run(self):
            return 1

    mod.A = A
    monkeypatch.setitem(sys.modules, "hp_fake_mod2", mod)
    specs = [("found", ("fork",), ("hp_fake_mod2:A.run", "hp_fake_mod2:A.gone")),
             ("lost", ("fork",), ("hp_fake_mod2:B.run",)),
             ("other row", ("lite",), ("hp_fake_mod2:B.run",))]
    s = hp.Sections(ScriptedClock(1, 1))
    assert hp.install(s, "fork", specs) == ["lost"]
    s.on = True
    assert A().run() == 1
    assert s.calls == {"found": 1}


def test_summary_takes_medians_and_leaves_out_the_timer(hp):
    def run(step, timer, a, b):
        return {"step_ms": step, "timer_ms": timer, "sections_ms": {"a": a, "b": b}}

    runs = {"fork": [run(3.0, 0.2, 1.0, 0.5), run(4.0, 0.2, 1.2, 0.6), run(5.0, 0.4, 1.1, 0.9)],
            "lite": [run(1.0, 0.0, 0.5, 0.1)] * 3}
    table = hp.summarize(runs)
    assert table["fork"]["a"] == pytest.approx(1.1) and table["fork"]["b"] == pytest.approx(0.6)
    assert table["fork"]["step"] == pytest.approx(4.0) and table["fork"]["timer"] == pytest.approx(0.2)
    # rest per run: 1.3, 2.0, 2.7
    assert table["fork"]["rest"] == pytest.approx(2.0)
    text = hp.markdown(table, 3, 100)
    assert "| section | fork Trainer | fork Lite |" in text
    assert "| rest | 2.000 | 0.400 |" in text and "| **step** | **4.000** | **1.000** |" in text


@RunIf(xla=True)
@pytest.mark.parametrize("row", ["fork", "lite"])
def test_a_short_run_times_each_section_once_a_step(hp, tmp_path, row):
    """A real worker of each fork row: every section it names is found, and the ones that happen once a step are
    timed once a step (a renamed class would otherwise drop out of the profile without a word)."""
    res = hp.run_worker(row, None, 40, 10, sys.executable, tmp_path / f"{row}.log")
    assert res["row"] == row and res["steps"] == 29
    calls = res["calls_per_step"]
    # the Trainer: the strategy's batch_to_device and the module's transfer_batch_to_device; Lite: the batch its
    # loader thread copied, taken
    assert calls["batch to device"] == (2 if row == "fork" else 1)
    once = ["data fetch", hp.USER_STEP, "autograd backward", "optimizer.zero_grad (torch)",
            "optimizer's own step (torch)"]
    if row == "lite":
        once += ["barrier (mark_step)", "device-to-host copy"]
    if row == "fork":
        # the step's barrier only: the loader thread hands out a batch without a barrier of its own (torch_xla's
        # `MpDeviceLoader` adds one); the device-to-host copy is made on Lightning's copying thread, off the step
        once += ["barrier (mark_step)", "self.log (LightningModule.log)", "self.log (result collection)", "progress bar",
                 "checkpoint callback", "running loss (1.8)",
                 "the fork's deferred transfer, with its consumers"]
        # one `metrics()` a step: the logger connector's, when the step's values reach the host (the progress bar
        # shows what is there already)
        assert calls["result collection metrics()"] == 1
        assert calls["the fork's XLA graph report"] == 2  # step_start and step_end
        # 13 LightningModule hooks, 6 callback hooks and 5 strategy hooks go through the Trainer's dispatch
        assert calls["hook dispatch, with the bodies of untimed hooks"] == 24
        # LightningOptimizer.step, Strategy.optimizer_step, the closure's __call__ and closure,
        # Strategy.training_step and backward, the precision plugin's backward, and the module's optimizer_step and
        # clip_gradients
        assert calls["plumbing of optimizer.step (LightningOptimizer, strategy, closure, clipping)"] == 9
        assert calls["precision plugin's optimizer_step, with torch's step wrapper and torch_xla.sync()"] == 1
    assert {k: calls.get(k) for k in once} == {k: 1 for k in once}
    assert all(v >= 0 for v in res["sections_ms"].values()) and res["step_ms"] > 0
