"""The upstream checks cannot be fooled by tests failing on both trees, by runs cut short, or by being skipped.

Tests failing on both trees need a reviewed reason, and must keep failing the way they did (their signature); a run
that pytest ended early fails; CI cannot skip the checks quietly.

A test that fails on the compat tree and on the series compares as "same" and guards nothing. The comparison
classifies every such test by the reviewed list ``tools/forkq/series/both_fail.txt``; one the list does not name, or one
that fails because upstream's test is written for an older pytest or torchmetrics, fails the check. CI runs the
checks through ``.ci/upstream-tests``, which fails when they cannot run unless ``FORK_SKIP_UPSTREAM_TESTS=1`` says so.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runif import RunIf

from forkq import common
from forkq.commands.upstream_tests import UpstreamTests
from forkq.common import ForkError
from forkq.series import both_fail, upstream_tests

NODE = "tests/tests_pytorch/models/test_tpu.py::test_tpu_misconfiguration[tpu_cores0]"


def _results(**by_key):
    """Both trees' outcome maps from ``{key: (compat outcome, series outcome, series message)}``."""
    out = {"compat": {}, "series": {}}
    for key, (compat, series, message) in by_key.items():
        out["compat"][key] = {"outcome": compat, "file": "tests/tests_pytorch/models/test_tpu.py", "message": ""}
        out["series"][key] = {"outcome": series, "file": "tests/tests_pytorch/models/test_tpu.py", "message": message}
    return out


def _list(tmp_path, text):
    path = tmp_path / "both_fail.txt"
    path.write_text(text)
    return both_fail.read_list(path)


def test_a_test_failing_on_both_trees_takes_the_cause_of_the_group_that_names_it(tmp_path):
    results = _results(**{
        "tests.tests_pytorch.models.test_tpu::test_tpu_misconfiguration[tpu_cores0]": ("failed", "failed", "x"),
        "tests.tests_pytorch.models.test_tpu::test_other": ("failed", "error", "boom"),
        "tests.tests_pytorch.models.test_tpu::test_passes_on_one": ("failed", "passed", ""),
        "tests.tests_pytorch.models.test_tpu::test_skipped": ("skipped", "skipped", ""),
    })
    failing = upstream_tests.both_failing(results)
    assert sorted(failing) == ["tests.tests_pytorch.models.test_tpu::test_other",
                               "tests.tests_pytorch.models.test_tpu::test_tpu_misconfiguration[tpu_cores0]"]
    assert failing["tests.tests_pytorch.models.test_tpu::test_tpu_misconfiguration[tpu_cores0]"]["node"] == NODE

    groups = _list(tmp_path, "[fork] XRT-era selection\n"
                             "tests/tests_pytorch/models/test_tpu.py::test_tpu_misconfiguration[*\n")
    classified = both_fail.classify(failing, groups, "cpu")
    assert classified["tests.tests_pytorch.models.test_tpu::test_tpu_misconfiguration[tpu_cores0]"] == {
        "cause": "fork", "reason": "XRT-era selection"}
    assert classified["tests.tests_pytorch.models.test_tpu::test_other"]["cause"] == both_fail.UNLISTED
    assert both_fail.by_cause(classified) == {"fork": 1, "unlisted": 1}


def test_brackets_in_a_pattern_are_literal_and_a_star_is_any_text():
    assert both_fail.matches(NODE, "tests/tests_pytorch/models/test_tpu.py::test_tpu_misconfiguration[tpu_cores0]")
    assert both_fail.matches(NODE, "tests/tests_pytorch/models/test_tpu.py::test_tpu_misconfiguration[*")
    # a module's path names a module that did not load, not every test in it
    assert not both_fail.matches(NODE, "tests/tests_pytorch/models/test_tpu.py")
    # `[tc]` is no character class
    assert not both_fail.matches("a::test[t]", "a::test[tc]")


def test_a_pattern_for_one_accelerator_holds_only_there(tmp_path):
    groups = _list(tmp_path, "[xla] runs on several XLA devices\ntests/t.py::test_a @xla\n")
    failing = {"k": {"node": "tests/t.py::test_a", "message": ""}}
    assert both_fail.classify(failing, groups, "xla")["k"]["cause"] == "xla"
    assert both_fail.classify(failing, groups, "cpu")["k"]["cause"] == both_fail.UNLISTED


@pytest.mark.parametrize(("message", "cause"), [
    ("TypeError: exceptions must be derived from Warning, not <class 'NoneType'>", "pytest"),
    ("TypeError: Accuracy.__new__() missing 1 required positional argument: 'task'", "torchmetrics"),
])
def test_a_test_written_for_an_older_pytest_or_torchmetrics_is_never_excused(tmp_path, message, cause):
    groups = _list(tmp_path, "[torch] listed anyway\ntests/t.py::test_a\n")
    classified = both_fail.classify({"k": {"node": "tests/t.py::test_a", "message": message}}, groups, "cpu")
    assert classified["k"]["cause"] == cause


@pytest.mark.parametrize(("text", "problem"), [
    ("[gremlins] a reason\ntests/t.py\n", "unknown cause 'gremlins'"),
    ("[torch]\ntests/t.py\n", "gives no reason"),
    ("tests/t.py\n", "before any [cause] line"),
    ("[torch] r\ntests/t.py @tpu\n", "@cpu or @xla only"),
])
def test_the_list_refuses_what_it_cannot_read(tmp_path, text, problem):
    with pytest.raises(ForkError, match=problem.replace("[", r"\[")):
        _list(tmp_path, text)


def test_the_reviewed_list_reads_and_every_group_has_patterns():
    groups = both_fail.read_list()
    assert groups and all(g.patterns and g.reason for g in groups)


def test_the_command_fails_on_an_unlisted_or_stale_both_fail_test(capsys):
    result = {"both_fail": {"tests": {"t::a": "torch", "t::b": both_fail.UNLISTED}}}
    assert UpstreamTests._both_fail_problem("fork.py", result) is True
    assert "t::b (unlisted)" in capsys.readouterr().err
    assert UpstreamTests._both_fail_problem("fork.py", {"both_fail": {"tests": {"t::c": "pytest"}}}) is True
    assert UpstreamTests._both_fail_problem("fork.py", {"both_fail": {"tests": {"t::a": "torch"}}}) is False


def test_a_module_marked_flaky_loads_under_strict_markers_with_the_markers_plugin(tmp_path):
    (tmp_path / "test_m.py").write_text("import pytest\n\n\n@pytest.mark.flaky(reruns=3)\ndef test_x():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(upstream_tests.XLA_PLUGIN_DIR)}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:rerunfailures",
            "--strict-markers", "test_m.py"]
    without = subprocess.run(base, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert without.returncode != 0 and "'flaky' not found in `markers`" in without.stdout
    with_plugin = subprocess.run(base[:3] + ["-p", upstream_tests.MARKERS_PLUGIN] + base[3:], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=120)
    assert with_plugin.returncode == 0 and "1 passed" in with_plugin.stdout


def _ci_upstream(tmp_path, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("UPSTREAM", "FORK_SKIP_UPSTREAM_TESTS")}
    return subprocess.run(["bash", str(common.ROOT / ".ci" / "upstream-tests")], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def test_ci_fails_when_upstream_s_tests_cannot_run(tmp_path):
    """Without a clone of upstream the check fails and says how to give one or to skip it on purpose."""
    run = _ci_upstream(tmp_path, UPSTREAM=str(tmp_path / "no-clone"))
    assert run.returncode == 1
    assert "cannot run" in run.stderr and "no git clone of Lightning-AI/lightning" in run.stderr
    assert "FORK_SKIP_UPSTREAM_TESTS=1" in run.stderr


def test_ci_skips_upstream_s_tests_only_when_told_and_says_so_loudly(tmp_path):
    run = _ci_upstream(tmp_path, UPSTREAM=str(tmp_path / "no-clone"), FORK_SKIP_UPSTREAM_TESTS="1")
    assert run.returncode == 0
    assert "!!! NOT RUN" in run.stderr and "did NOT check that the fork is a drop-in" in run.stderr


def test_ci_runs_the_upstream_checks_after_the_test_suite():
    run = (common.ROOT / ".ci" / "run").read_text().splitlines()
    assert run.index("make test") < run.index("bash .ci/upstream-tests")
    guard = (common.ROOT / ".ci" / "upstream-tests").read_text()
    assert 'make upstream-tests-xla-check UPSTREAM="$UPSTREAM"' in guard
    assert 'make upstream-tests UPSTREAM="$UPSTREAM"' in guard
    assert 'make upstream-test-edits UPSTREAM="$UPSTREAM"' in guard


def test_a_run_pytest_ended_early_fails_the_comparison(tmp_path, capsys):
    """An internal error (a pytest-xdist worker lost while it reported a failure) ends the run before most tests:
    those tests are simply absent, so the run itself must count as a failure."""
    log = tmp_path / "pytest.log"
    log.write_text("....F\nINTERNALERROR> AssertionError: ('tests/x.py::test_y', <WorkerController gw0>)\n")
    assert upstream_tests.aborted(1, False, log)
    assert upstream_tests.aborted(3, False)
    assert upstream_tests.aborted(2, False)
    assert not upstream_tests.aborted(2, True)  # stopped by the run's own --timeout: reported as such
    log.write_text("....F\n1 failed, 4 passed\n")
    assert not upstream_tests.aborted(1, False, log)
    assert UpstreamTests._aborted("fork.py", {"trees": {"series": {"aborted": True}, "compat": {}}}) is True
    assert "ended the series tree's run early" in capsys.readouterr().err
    assert UpstreamTests._aborted("fork.py", {"trees": {"series": {"aborted": False}}}) is False


NATIVE = '''Traceback (most recent call last):
  File "/work/build/series/tests/tests_pytorch/checkpointing/test_top.py", line 81, in test_top_k
    trainer.fit(model)
  File "/work/build/series/src/pytorch_lightning/trainer/trainer.py", line 623, in fit
RuntimeError: Expected XLA tensor. Got: torch.FloatTensor'''
LONG = '''    def test_top_k():
>       assert torch.allclose(w0, w1)
E       assert False

tests/tests_pytorch/checkpointing/test_top.py:238: AssertionError'''
TOP = "tests/tests_pytorch/checkpointing/test_top.py"


def test_a_failure_signature_is_its_type_its_message_without_what_changes_and_the_test_s_line():
    assert upstream_tests.signature("RuntimeError: Expected XLA tensor. Got: torch.FloatTensor", NATIVE, TOP) == (
        "RuntimeError | Expected XLA tensor. Got: torch.FloatTensor | line 81")
    assert upstream_tests.signature("assert False\n +  where False = ...", LONG, TOP) == (
        "AssertionError | assert False | line 238")
    # addresses, numbers and paths differ from run to run; the rest is what the failure says
    one = upstream_tests.signature("MisconfigurationException: devices=8 at 0x7f1c on /tmp/pytest-of-root/p0/a.ckpt",
                                   "", TOP)
    two = upstream_tests.signature("MisconfigurationException: devices=2 at 0x7e00 on /tmp/pytest-of-root/p7/a.ckpt",
                                   "", TOP)
    assert one == two == "MisconfigurationException | devices=N at <address> on <path> | line "
    assert upstream_tests.signature('failed on teardown with "AssertionError: leaking {\'X\'}"', "", "") == (
        "AssertionError | leaking {'X'} | line ")


def test_a_rewritten_assert_has_one_signature_with_or_without_pytest_s_prefix():
    """pytest keeps or drops ``AssertionError: `` before a rewritten assert depending on the quotes in the values
    compared (random tensors in test_hooks): CI saw the same failure both ways and called it a new one."""
    kept = upstream_tests.signature("AssertionError: assert [{'name': 'co...mizers'}] == [{'n'}]\nAt index 18", LONG,
                                    TOP)
    dropped = upstream_tests.signature("assert [{'name': 'co...mizers'}] == [{'n'}]\nAt index 18", LONG, TOP)
    assert kept == dropped == "AssertionError | assert [{'name': 'co...mizers'}] == [{'n'}] | line 238"
    # what the harness recorded before (prefix in the message, cut at 200 with it) compares equal to it
    old = "AssertionError | AssertionError: assert [{'name': 'co...mizers'}] == [{'n'}] | line 238"
    assert upstream_tests.canonical(old) == upstream_tests.canonical(" | assert [{'name': 'co...mizers'}] == [{'n'}]"
                                                                     " | line 238") == kept
    long = "x" * 300
    recorded = "KeyError | " + f"KeyError: {long}"[:200] + " | line "
    assert upstream_tests.canonical(recorded) == upstream_tests.signature(f"KeyError: {long}", "", "") == (
        "KeyError | " + "x" * upstream_tests.SIGNATURE_MESSAGE + " | line ")
    # a message cut where a space falls reads the same however often it is made canonical
    spaced = "MisconfigurationException | " + "word " * 60 + "| line 3"
    assert upstream_tests.canonical(upstream_tests.canonical(spaced)) == upstream_tests.canonical(spaced)
    # another type named in the message stays in it
    assert upstream_tests.canonical("RuntimeError | ValueError: x | line 2") == "RuntimeError | ValueError: x | line 2"
    results = _both("AssertionError | assert [N] == [N] | line 7")
    assert upstream_tests.changed_signatures(results, {"t::a": "AssertionError | AssertionError: assert [N] == [N] | "
                                                                "line 7"}) == []


def _both(series_signature, compat_signature="RuntimeError | boom | line 3"):
    entry = {"outcome": "failed", "file": TOP, "message": "m"}
    return {"compat": {"t::a": {**entry, "signature": compat_signature}},
            "series": {"t::a": {**entry, "signature": series_signature}}}


def test_a_test_failing_on_both_trees_in_a_new_way_is_a_difference():
    """The same outcome word on both trees hid a series that breaks a failing test differently."""
    was = "RuntimeError | boom | line 3"
    assert upstream_tests.changed_signatures(_both(was), {"t::a": was}) == []
    assert upstream_tests.changed_signatures(_both("KeyError | 'x' | line 9"), {}) == []  # nothing recorded yet
    changed = upstream_tests.changed_signatures(_both("KeyError | 'x' | line 9"), {"t::a": was})
    assert [(d["test"], d["signature_was"], d["signature_now"], d["flaky"]) for d in changed] == [
        ("t::a", was, "KeyError | 'x' | line 9", False)]
    # a rerun on the series that fails the recorded way again makes it flaky, not a change of the series
    reruns = {"series": [{"t::a": {"outcome": "failed", "signature": was}}]}
    assert upstream_tests.changed_signatures(_both("KeyError | 'x' | line 9"), {"t::a": was}, reruns)[0]["flaky"]


def test_the_results_and_the_baseline_keep_the_signatures(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text('<?xml version="1.0"?><testsuites><testsuite>'
                   f'<testcase classname="tests.tests_pytorch.checkpointing.test_top" name="test_top_k" file="{TOP}">'
                   '<failure message="RuntimeError: Expected XLA tensor. Got: torch.FloatTensor">'
                   f'{NATIVE}</failure></testcase></testsuite></testsuites>')
    outcomes = upstream_tests.read_outcomes(xml)
    assert outcomes["tests.tests_pytorch.checkpointing.test_top::test_top_k"]["signature"].endswith("| line 81")
    out = tmp_path / "result.json"
    out.write_text('{"signatures": {"t::a": "X | y | line 1"}}')
    assert upstream_tests.previous_signatures(out) == {"t::a": "X | y | line 1"}
    assert upstream_tests.previous_signatures(tmp_path / "none.json") == {}


def test_a_timeout_and_a_crash_are_outcomes_of_their_own():
    assert upstream_tests.failure_kind("failed", "Failed: Timeout >300.0s") == "timeout"
    assert upstream_tests.failure_kind("failed", "Failed: Timeout (>300.0s) from pytest-timeout.") == "timeout"
    assert upstream_tests.failure_kind("error", "worker 'gw1' crashed while running 'tests/t.py::test_a'") == "crashed"
    assert upstream_tests.failure_kind("failed", "AssertionError: assert 1 == 2") == "failed"
    assert upstream_tests.failure_kind("passed", "") == "passed"


def test_a_timeout_on_the_compat_tree_never_stands_for_a_failure_on_the_series():
    """The compat tree is slow on XLA: its timeouts must not hide the series failing the same test."""
    entry = {"file": TOP, "message": ""}
    results = {"compat": {"t::a": {**entry, "outcome": "timeout"}, "t::b": {**entry, "outcome": "timeout"}},
               "series": {"t::a": {**entry, "outcome": "failed"}, "t::b": {**entry, "outcome": "passed"}}}
    compared = upstream_tests.compare(results, {})
    assert compared["unexplained"] == ["t::a"]
    assert compared["improved"] == ["t::b"]  # passing where upstream's code timed out is no drop-in break


REFUSED = ("_pickle.UnpicklingError: Weights only load failed. This file can still be loaded ... WeightsUnpickler"
           " error: Unsupported global: GLOBAL omegaconf.dictconfig.DictConfig was not an allowed global by default.")


def test_a_refusal_of_torch_s_default_on_both_sides_is_explained_and_nothing_else():
    """The series runs with torch's default (weights only); the compat tree loads as in 2022. A test whose own
    ``torch.load`` the safe unpickler refuses on the series is explained only when upstream's side, run once more
    under torch's default, fails it with the same signature; another failure there, or a pass, leaves it unexplained.
    """
    sig = upstream_tests.signature(REFUSED, "", "tests/t.py")
    entry = {"file": TOP}
    refused = {**entry, "outcome": "failed", "message": REFUSED, "signature": sig}
    results = {"compat": {k: {**entry, "outcome": "passed", "message": ""} for k in ("t::a", "t::b", "t::c")},
               "series": {"t::a": refused, "t::b": refused,
                          "t::c": {**entry, "outcome": "failed", "message": "AssertionError: 1 != 2",
                                   "signature": "AssertionError | 1 != 2 | line 3"}}}
    # what the compat tree did under torch's default: a's refusal is the same; b passes there
    torch_default = {"t::a": refused, "t::b": {**entry, "outcome": "passed", "message": ""},
                     "t::c": {**entry, "outcome": "failed", "message": "AssertionError: 1 != 2",
                              "signature": "AssertionError | 1 != 2 | line 3"}}
    compared = upstream_tests.compare(results, {}, torch_default=torch_default)
    assert compared["unexplained"] == ["t::b", "t::c"]
    assert [d["torch_default"] for d in compared["differences"]] == [True, False, False]
    # without that run nothing is explained
    assert upstream_tests.compare(results, {})["unexplained"] == ["t::a", "t::b", "t::c"]
    assert [d["test"] for d in upstream_tests.refused_by_torch(compared["differences"], ["t::a", "t::b", "t::c"])] \
        == ["t::a", "t::b"]


# the committed baseline is the torch_xla stack's: on the TorchTPU stack (torch 2.14) it is another stack's by design
@RunIf(min_torch_xla="2.9")
def test_the_check_refuses_a_baseline_written_for_another_stack_or_compat_tree(tmp_path):
    """The committed baseline stands for this run's compat tree; one written by another torch, or by a compat tree
    that lacked a compat patch, cannot, and the check says why and how to write it again."""
    import json

    baseline = json.loads(upstream_tests.BASELINE_XLA.read_text())
    assert upstream_tests.baseline_problems(baseline) == []
    older = {**baseline, "versions": {**baseline["versions"], "torch": "2.8.0"}, "patches": baseline["patches"][1:]}
    problems = upstream_tests.baseline_problems(older)
    assert any(p.startswith("torch 2.8.0 wrote it") for p in problems)
    assert any(f"new since: {baseline['patches'][0]}" in p for p in problems)
    # another selection of upstream's tests: other folders, other modules left out
    narrower = {**baseline, "dirs": ["tests_pytorch/trainer"], "left_out_modules": {}}
    problems = upstream_tests.baseline_problems(narrower)
    assert any(p.startswith("it ran the folders tests_pytorch/trainer, this run") for p in problems)
    assert any(p.startswith("it left out other modules") for p in problems)
    stale = tmp_path / "baseline.json"
    stale.write_text(json.dumps(older))
    with pytest.raises(ForkError, match="not written for this run: .*Write it again with `make upstream-tests-xla"):
        upstream_tests.check(tmp_path / "no-clone", stale, tmp_path / "build", tmp_path / "out.json",
                             log=lambda message: None)


def test_a_test_that_times_out_or_crashes_on_both_trees_needs_a_reviewed_reason_too(tmp_path):
    """Timeouts and crashes are outcomes of their own; on both trees they count as failing, so the list must name
    them, as it must name a failure."""
    entry = {"file": TOP, "message": "Failed: Timeout >300.0s"}
    results = {"compat": {"t::a": {**entry, "outcome": "timeout"}, "t::b": {**entry, "outcome": "crashed"}},
               "series": {"t::a": {**entry, "outcome": "timeout"}, "t::b": {**entry, "outcome": "crashed"}}}
    assert sorted(upstream_tests.both_failing(results)) == ["t::a", "t::b"]
    assert upstream_tests.compare(results, {})["differences"] == []  # the same outcome: no difference, but listed


def test_a_new_way_of_failing_that_is_already_a_difference_is_reported_once():
    """compat failed, series error with another signature: the outcome difference says it, once."""
    entry = {"file": TOP, "message": "m"}
    results = {"compat": {"t::a": {**entry, "outcome": "failed", "signature": "A | a | line 1"}},
               "series": {"t::a": {**entry, "outcome": "error", "signature": "B | b | line 2"}}}
    compared = upstream_tests.compare(results, {})
    changed = upstream_tests.changed_signatures(results, {"t::a": "A | a | line 1"})
    assert [d["test"] for d in compared["differences"]] == ["t::a"] and [d["test"] for d in changed] == ["t::a"]


def test_every_folder_runs_but_the_declared_modules_which_pytest_ignores(tmp_path, monkeypatch):
    """Both runs take all of upstream's tests_pytorch and tests_lite; the modules left out are named with a reason,
    ignored by pytest, and recorded in the baseline, so that a baseline of another selection is refused."""
    assert upstream_tests.DIRS == upstream_tests.XLA_DIRS == ("tests_pytorch", "tests_lite")
    assert upstream_tests.LEFT_OUT and all(len(why) > 40 for why in upstream_tests.LEFT_OUT.values())
    seen = {}

    def fake_run_pytest(args, cwd, env, python, timeout, junit, log):
        seen["args"] = list(args)
        log.write_text("")
        return upstream_tests.engine.Run(0, "", [], 0.1, False)

    monkeypatch.setattr(upstream_tests.engine, "run_pytest", fake_run_pytest)
    upstream_tests.run_tree(tmp_path, upstream_tests.DIRS, test_timeout=60, timeout=60)
    ignored = [a.split("=", 1)[1] for a in seen["args"] if a.startswith(("--ignore=", "--deselect="))]
    assert ignored == [f"tests/{left}" for left in sorted(upstream_tests.LEFT_OUT)]
    # a module is ignored, a single test deselected
    assert all(("::" in a) == a.startswith("--deselect=") for a in seen["args"] if a.startswith("--"))
    assert seen["args"][-2:] == ["tests/tests_pytorch", "tests/tests_lite"]


def test_upstream_tests_see_the_default_signal_handlers_however_the_tool_was_started(tmp_path):
    """Started under `nohup` (SIGHUP ignored) or in a script's background (SIGINT ignored), the tool's pytest inherited
    those handlers, and upstream's signal connector tests (`test_auto_requeue_custom_signal_flag[1-...]`: SIGHUP) then
    failed on both trees. The tool's pytest starts with the defaults."""
    import signal

    from forkq.series import engine

    (tmp_path / "test_handlers.py").write_text(
        "import signal\n\n"
        "def test_defaults():\n"
        "    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL\n"
        "    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL\n"
        "    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
    )
    ignored = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGUSR1)}
    try:
        ran = engine.run_pytest(["-q", "test_handlers.py"], cwd=tmp_path, env=dict(os.environ), timeout=120)
    finally:
        for sig, handler in ignored.items():
            signal.signal(sig, handler)
    assert ran.returncode == 0, ran.output[-2000:]
    assert [c["outcome"] for c in ran.cases] == ["passed"]


def test_a_tree_that_pytest_ended_early_runs_once_more_and_a_second_early_end_stays(tmp_path):
    """An early end is the harness failing (a lost pytest-xdist worker), not a test: the tree runs again once, and the
    first run's log is kept; an early end of that run too stays in the result and fails the comparison."""
    results = iter([{"aborted": True, "exit_code": 1}, {"aborted": False, "exit_code": 1}])
    (tmp_path / "pytest.log").write_text("INTERNALERROR> lost\n")
    said = []
    again = upstream_tests.once_more_if_ended_early(tmp_path, lambda: next(results), said.append)
    assert again == {"aborted": False, "exit_code": 1, "ended_early_before": True}
    assert (tmp_path / "pytest-ended-early.log").read_text() == "INTERNALERROR> lost\n"
    assert "running the tree once more" in said[0]
    twice = iter([{"aborted": True}, {"aborted": True}])
    assert upstream_tests.once_more_if_ended_early(tmp_path, lambda: next(twice), said.append)["aborted"] is True
    assert UpstreamTests._aborted("fork.py", {"trees": {"series": {"aborted": True}}}) is True
    calls = []
    assert upstream_tests.once_more_if_ended_early(tmp_path, lambda: calls.append(1) or {"aborted": False}) == {
        "aborted": False}
    assert calls == [1]


def test_a_failed_comparison_says_every_reason_last(capsys):
    result = {"unexplained": ["tests.a::t"], "both_fail": {"tests": {"tests.b::u": "unlisted"}},
              "trees": {"series": {"aborted": True}}}
    assert UpstreamTests()._verdict("fork.py", result) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("fork.py: the comparison failed: tests failing on both trees without a reviewed reason; a tree's"
                    " run ended early; 1 unexplained differences")
    assert UpstreamTests()._verdict("fork.py", {"unexplained": [], "both_fail": {"tests": {}}, "trees": {}}) == 0
    assert capsys.readouterr().err == ""


def test_run_tree_runs_a_tree_once_more_after_pytest_ended_it_early(tmp_path, monkeypatch):
    """Both callers of ``run_tree`` (the CPU comparison and the XLA check CI runs) get the second run: an
    ``INTERNALERROR`` in the first log makes it, a clean second log ends it."""
    logs = iter(["INTERNALERROR> lost a worker\n", "1 passed\n"])

    def fake_run_pytest(args, cwd, env, python, timeout, junit, log):
        log.write_text(next(logs))
        return upstream_tests.engine.Run(1, "", [], 0.1, False)

    monkeypatch.setattr(upstream_tests.engine, "run_pytest", fake_run_pytest)
    said = []
    run = upstream_tests.run_tree(tmp_path, upstream_tests.DIRS, test_timeout=60, timeout=60, log=said.append)
    assert run["aborted"] is False and run["ended_early_before"] is True
    assert (tmp_path / "pytest-ended-early.log").read_text() == "INTERNALERROR> lost a worker\n"
    assert len(said) == 1


GATHER = "tests.tests_lite.utilities.test_distributed::test_gather_all_tensors[devices1-_test_all_gather_uneven_tensors]"
GATHER_FILE = "tests/tests_lite/utilities/test_distributed.py"


def _junit(path: Path, cases) -> None:
    """A JUnit XML file (xunit1, with file names) of ``cases``: ``(test id, outcome)``, outcome passed or failed."""
    rows = []
    for key, outcome in cases:
        classname, _, name = key.rpartition("::")
        failure = '<failure message="process 1 terminated with signal SIGABRT">abort</failure>' \
            if outcome == "failed" else ""
        rows.append(f'<testcase classname="{classname}" name="{name}" file="{GATHER_FILE}">{failure}</testcase>')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite>{"".join(rows)}</testsuite></testsuites>')


def _build(tmp_path, series_reruns):
    """A build folder as a run leaves it: the gather test failed on both trees, and ``series_reruns`` are its outcomes
    in the reruns of its module on the series (the compat tree failed it again in each)."""
    build = tmp_path / "build"
    for tree in upstream_tests.TREES:
        _junit(build / tree / "junit.xml", [(GATHER, "failed"), (GATHER.replace("uneven", "even"), "passed")])
        (build / tree / "patches.json").write_text('{"patches": [], "left_out": {}}')
    for i, outcome in enumerate(series_reruns, 1):
        _junit(build / "series" / f"rerun-{i}.xml", [(GATHER, outcome)])
        _junit(build / "compat" / f"rerun-{i}.xml", [(GATHER, "failed")])
    return build


def test_an_unlisted_test_failing_on_both_trees_runs_again_and_passing_on_the_series_there_makes_it_flaky(tmp_path):
    """CI met upstream's gloo gather test aborting (SIGABRT in gloo's teardown) on both trees in one run: unlisted,
    the check failed. Such a test now runs again with the differences; passing on the series there, it is flaky and
    the check passes; failing there again, it stays unlisted and the check fails."""
    patch_dir = tmp_path / "patches"
    patch_dir.mkdir()
    (patch_dir / "series").write_text("")
    build = _build(tmp_path, [])
    first = upstream_tests.report(build, upstream_tests.DIRS, {}, "synthetic", None, patch_dir)
    assert first["both_fail"]["tests"] == {GATHER: both_fail.UNLISTED}
    # the first run's result names the test to run again, with its module
    assert upstream_tests.to_run_again(build, first) == [{"test": GATHER, "file": GATHER_FILE}]

    flaky = upstream_tests.report(_build(tmp_path / "a", ["failed", "passed"]), upstream_tests.DIRS, {}, "synthetic",
                                  None, patch_dir)
    assert flaky["both_fail"]["tests"] == {GATHER: both_fail.FLAKY}
    assert flaky["both_fail"]["by_cause"] == {"flaky": 1}
    assert flaky["both_fail"]["causes"]["flaky"] == both_fail.FLAKY_REASON
    assert f"{GATHER}: flaky" in upstream_tests.summary(flaky)
    assert UpstreamTests._both_fail_problem("fork.py", flaky) is False

    steady = upstream_tests.report(_build(tmp_path / "b", ["failed", "failed"]), upstream_tests.DIRS, {}, "synthetic",
                                   None, patch_dir)
    assert steady["both_fail"]["tests"] == {GATHER: both_fail.UNLISTED}
    assert UpstreamTests._both_fail_problem("fork.py", steady) is True


def test_a_listed_or_stale_test_failing_on_both_trees_keeps_its_cause_when_it_passes_again(tmp_path):
    """Passing in a rerun excuses only what the list does not name: a listed test keeps its reviewed cause, and a test
    written for an older pytest is never excused."""
    failing = {"t::listed": {"node": NODE, "message": ""},
               "t::stale": {"node": "tests/x.py::t", "message": "TypeError: exceptions must be derived from Warning"},
               "t::other": {"node": "tests/x.py::other", "message": ""}}
    groups = _list(tmp_path, "[fork] XRT-era selection\ntests/tests_pytorch/models/test_tpu.py::*\n")
    reruns = {"series": [{"t::listed": {"outcome": "passed"}, "t::stale": {"outcome": "passed"}}],
              "compat": [{"t::other": {"outcome": "passed"}}]}
    again = upstream_tests.passed_again(failing, reruns)
    assert again == {"t::listed", "t::stale"}  # a pass on the compat tree alone does not count
    classified = both_fail.classify(failing, groups, "cpu", again)
    assert {k: v["cause"] for k, v in classified.items()} == {"t::listed": "fork", "t::stale": "pytest",
                                                              "t::other": both_fail.UNLISTED}
