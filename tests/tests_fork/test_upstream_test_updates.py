"""Patches that update upstream's own tests: their ``tests/`` sections are skipped by materialize, kept by refresh,
counted apart by ``touched_files``, exported to the 1.8.6 PR series and applied to the tag's tests; and
``forkq.series.upstream_tests`` (``make upstream-tests``) runs upstream's tests on the compat patches alone and on the whole series and compares.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.runif import RunIf

import forkq.tree
import forkq.upstream
from forkq import authoring, common, patchfile, rules, seriesfile, upstream
from forkq.common import ForkError
from forkq.series import test_edits, upstream_tests
from forkq.series.pr186.check_tag import check_tag
from forkq.series.pr186.export import export
from tests_fork.synthetic import append, combine, git, make_queue, replace


PL_TPU = "src/pytorch_lightning/plugins/precision/tpu.py"
LITE_TPU = "src/lightning_lite/plugins/precision/tpu.py"
PL_CHANGELOG = "src/pytorch_lightning/CHANGELOG.md"
HEADER = "## [1.8.6] - 2022-12-21\n\n"
UPSTREAM_TEST = "tests/tests_pytorch/test_thing.py"
# upstream's test file in the synthetic tag: it reads the sources as text, so that running it needs no torch
THING = '''from pathlib import Path

TPU = Path("src/pytorch_lightning/plugins/precision/tpu.py")
LITE = Path("src/lightning_lite/plugins/precision/tpu.py")


def test_unchanged():
    assert TPU.exists()


def test_changed_on_purpose():
    assert "FIX_A" not in TPU.read_text()


def test_changed_by_accident():
    assert "FIX_B" not in LITE.read_text()
'''
SETUP_CFG = "[tool:pytest]\naddopts = --strict-markers\n"


@pytest.fixture(scope="module")
def tag(tmp_path_factory) -> Path:
    """A git repository standing for upstream's: tag ``1.8.6`` holds the wheel's ``src/``, a small ``tests/`` tree,
    ``setup.cfg`` and the other files ``check-tag`` takes from the tag."""
    repo = tmp_path_factory.mktemp("upstream") / "lightning"
    lock = upstream.read_lock()
    upstream.unpack_packages(upstream.fetch_wheel("pytorch-lightning", lock["pytorch-lightning"]), repo / "src")
    (repo / "tests" / "tests_pytorch").mkdir(parents=True)
    (repo / "tests" / "tests_pytorch" / "__init__.py").write_text("")
    (repo / UPSTREAM_TEST).write_text(THING)
    (repo / "tests" / "tests_lite").mkdir()
    (repo / "tests" / "tests_lite" / "__init__.py").write_text("")
    (repo / "setup.cfg").write_text(SETUP_CFG)
    (repo / "setup.py").write_text("")
    (repo / "pyproject.toml").write_text("")
    (repo / "requirements").mkdir()
    (repo / "requirements" / "base.txt").write_text("")
    git(["init", "-q"], repo)
    git(["add", "-A"], repo)
    git(["commit", "-q", "-m", "1.8.6"], repo)
    git(["tag", "1.8.6"], repo)
    return repo


def _test_update(tag: Path) -> str:
    """The diff of fix A's update of upstream's test, made against the tag's file."""
    path = tag / UPSTREAM_TEST
    path.write_text(THING.replace('assert "FIX_A" not in TPU.read_text()', 'assert "FIX_A = 1" in TPU.read_text()'))
    try:
        return git(["diff", "--full-index"], tag)
    finally:
        git(["checkout", "--", UPSTREAM_TEST], tag)


def _changelog(entry: str):
    return replace(PL_CHANGELOG, HEADER, f"{HEADER}### Fixed\n\n- {entry}\n\n")


@pytest.fixture
def queue(tmp_path, tag) -> Path:
    """compat 0001, fix 0002 (carries an update of upstream's test), fix 0003, compat 0004 porting a line of 0002."""
    root = make_queue(tmp_path / "q", [
        {"name": "0001-compat-thing.patch", "subject": "Compat thing", "kind": "compat",
         "edit": append("src/pytorch_lightning/__about__.py", "COMPAT = 1\n")},
        {"name": "0002-fix-a.patch", "subject": "Fix A", "kind": "fix",
         "edit": combine(append(PL_TPU, "FIX_A = 1\n"), _changelog("Fixed A"))},
        {"name": "0003-fix-b.patch", "subject": "Fix B", "kind": "fix", "edit": append(LITE_TPU, "FIX_B = 2\n")},
        {"name": "0004-compat-port-a.patch", "subject": "Compat: port A", "kind": "compat",
         "edit": replace(PL_TPU, "FIX_A = 1\n", "FIX_A = 1  # ported\n")},
    ])
    patch = root / "patches" / "0002-fix-a.patch"
    patch.write_text(patch.read_text() + _test_update(tag))
    for root_name in ("tests_pytorch", "tests_lite"):
        (root / "tests" / root_name).mkdir(parents=True)
    return root


def _restat(patch: Path) -> None:
    text = patch.read_text()
    patch.write_text(patchfile.with_diff(text, patchfile.merge_diffs(*patchfile.split_diff(patchfile.Patch(text).diff))))


def test_the_diffstat_is_what_git_format_patch_writes():
    """Every patch of the real series keeps its diffstat when it is redrawn from its diff."""
    for name in seriesfile.read_series():
        text = (common.PATCH_DIR / name).read_text()
        assert patchfile.with_diff(text, patchfile.Patch(text).diff) == text, name


def test_test_sections_are_skipped_counted_apart_and_kept_by_refresh(queue, monkeypatch, tmp_path):
    patch = queue / "patches" / "0002-fix-a.patch"
    _restat(patch)
    text = patch.read_text()
    assert rules.validate(patch) == []
    # the diffstat counts the test file too
    assert re.search(r"^ tests/tests_pytorch/test_thing\.py +\| +2 \+-$", text, flags=re.M), text
    assert re.search(r"^ 3 files changed, 6 insertions\(\+\), 1 deletion\(-\)$", text, flags=re.M), text
    diff = patchfile.Patch(text).diff
    src_part, tests_part = patchfile.split_diff(diff)
    assert patchfile.touched_files(diff, tree="tests") == [UPSTREAM_TEST]
    assert patchfile.touched_files(diff, tree="src") == [PL_CHANGELOG, PL_TPU] == patchfile.touched_files(src_part)
    assert patchfile.touched_files(diff) == [PL_CHANGELOG, PL_TPU, UPSTREAM_TEST]
    assert patchfile.touched_files(tests_part) == [UPSTREAM_TEST]

    # materialize applies the src/ sections only; the wheel has no tests to update
    lock = upstream.read_lock()
    forkq.tree.build_tree(tmp_path / "built", ["0001-compat-thing.patch", "0002-fix-a.patch"], lock, queue / "patches")
    assert "FIX_A = 1" in (tmp_path / "built" / PL_TPU).read_text()
    assert not (tmp_path / "built" / "tests").exists()

    # refresh rebuilds the src/ sections from src/ and carries the test update over unchanged
    monkeypatch.setattr(common, "PATCH_DIR", queue / "patches")
    monkeypatch.setattr(common, "SERIES_FILE", queue / "patches" / "series")
    monkeypatch.setattr(common, "LOCK_FILE", queue / "upstream.lock")
    src = forkq.tree.materialize(queue / "src", upto="0002", lock_file=queue / "upstream.lock",
                           patch_dir=queue / "patches", quiet=True)
    tpu = src / "pytorch_lightning" / "plugins" / "precision" / "tpu.py"
    tpu.write_text("FIX_A_MORE = 2\n" + tpu.read_text())
    authoring.refresh("0002", src=src)
    refreshed = patch.read_text()
    new_src, new_tests = patchfile.split_diff(patchfile.Patch(refreshed).diff)
    assert new_tests == tests_part
    assert "+FIX_A_MORE = 2" in new_src
    assert patchfile.Patch(refreshed).body == patchfile.Patch(text).body
    assert re.search(r"^ 3 files changed, 7 insertions\(\+\), 1 deletion\(-\)$", refreshed, flags=re.M), refreshed
    # the later patches still apply
    forkq.tree.materialize(queue / "full" / "src", lock_file=queue / "upstream.lock", patch_dir=queue / "patches",
                     quiet=True)

    # restat redraws a stale diffstat and leaves the rest of the file alone
    stale = refreshed.replace(" 3 files changed", " 2 files changed")
    patch.write_text(stale)
    authoring.restat("0002")
    assert patch.read_text() == refreshed


def test_the_pr_series_carries_the_test_update_to_the_tag(queue, tag, tmp_path):
    _restat(queue / "patches" / "0002-fix-a.patch")
    out, doc = tmp_path / "pr-series", tmp_path / "upstream-prs.md"
    mboxes = export(out, doc, patch_dir=queue / "patches", tests_root=queue / "tests",
                              lock_file=queue / "upstream.lock")
    first = mboxes[0].read_text()
    assert f"diff --git a/{UPSTREAM_TEST} b/{UPSTREAM_TEST}" in first
    assert '+    assert "FIX_A = 1" in TPU.read_text()' in first
    assert UPSTREAM_TEST not in mboxes[1].read_text()
    assert re.search(r"^ tests/tests_pytorch/test_thing\.py +\| +2 \+-$", first, flags=re.M), first
    text = doc.read_text()
    assert f"- `{UPSTREAM_TEST}` (upstream's, updated for the change of behaviour): `test_changed_on_purpose`" in text
    # the wheel's tree lacks upstream's tests, but the PR applies to the tag on its own
    assert text.count("on its own: yes") == 2

    # on upstream's (here: the synthetic) tag, git am takes the update and the updated test runs and passes
    result = check_tag(tag / ".git", out, patch_dir=queue / "patches", result_file=tmp_path / "r.json")
    assert result["updated_upstream_tests"] == [f"{UPSTREAM_TEST}::test_changed_on_purpose"]
    assert result["collect_ok"] and result["run_ok"], result
    assert result["run"] == {"passed": 1}
    # the result says what it measured: the fork's version with the digest of the queue's series
    stamp = json.loads((tmp_path / "r.json").read_text())["stamp"]
    assert stamp["fork"].startswith("1.8.6+xla.") and stamp["fork"].endswith(".g" + stamp["digest"][:8])


def test_read_junit_keeps_the_worst_outcome(tmp_path):
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<?xml version="1.0"?><testsuites><testsuite>'
        '<testcase classname="tests.t" name="test_a" file="tests/t.py"/>'
        '<testcase classname="tests.t" name="test_b" file="tests/t.py"><failure message="boom"/></testcase>'
        '<testcase classname="tests.t" name="test_b" file="tests/t.py"><error message="teardown"/></testcase>'
        '<testcase classname="tests.t" name="test_c[1]" file="tests/t.py"><skipped type="pytest.xfail" message="x"/>'
        '</testcase>'
        '<testcase classname="tests.t" name="test_d" file="tests/t.py"><skipped type="pytest.skip" message="s"/>'
        '</testcase>'
        '<testcase classname="" name="tests.broken"><error message="collection failure"/></testcase>'
        '</testsuite></testsuites>')
    outcomes = upstream_tests.read_outcomes(xml)
    assert {k: v["outcome"] for k, v in outcomes.items()} == {
        "tests.t::test_a": "passed", "tests.t::test_b": "failed", "tests.t::test_c[1]": "xfailed",
        "tests.t::test_d": "skipped", "tests.broken": "error"}
    assert outcomes["tests.t::test_b"]["message"] == "boom"
    assert upstream_tests.counts(outcomes) == {"failed": 1, "error": 1, "xfailed": 1, "skipped": 1, "passed": 1}


def test_a_compat_patch_left_out_of_the_compat_tree_holds_only_lines_the_fixes_add(tmp_path):
    """The compat tree is the whole compat port: a compat patch that ports a fix's line and also changes a line of
    upstream's is refused (the upstream part belongs in a compat patch before the fixes), naming that hunk."""
    root = make_queue(tmp_path / "q", [
        {"name": "0001-compat-thing.patch", "subject": "Compat thing", "kind": "compat",
         "edit": append("src/pytorch_lightning/__about__.py", "COMPAT = 1\n")},
        {"name": "0002-fix-a.patch", "subject": "Fix A", "kind": "fix", "edit": append(PL_TPU, "FIX_A = 1\n")},
        {"name": "0003-compat-port-a-and-more.patch", "subject": "Compat: port A and more", "kind": "compat",
         "edit": combine(replace(PL_TPU, "FIX_A = 1\n", "FIX_A = 1  # ported\n"),
                         append("src/pytorch_lightning/__about__.py", "MORE = 2\n"))},
    ])
    with pytest.raises(ForkError, match=r"0003-compat-port-a-and-more.patch .*some of its hunks do: "
                                        r"src/pytorch_lightning/__about__.py:\d+\. The compat tree must hold"):
        upstream_tests.tree_patches("compat", root / "patches")
    # the hunk that ports the fix's line alone does not apply to the compat tree; the other one does
    diff = patchfile.Patch.read(root / "patches" / "0003-compat-port-a-and-more.patch").diff
    assert [where.split(":")[0] for where, _ in upstream_tests.hunks(diff)] == [
        "src/pytorch_lightning/__about__.py", PL_TPU]


def test_upstream_tests_on_both_trees(queue, tag, tmp_path):
    """The compat tree leaves out the compat patch that ports a fix's line; each tree gets the tag's tests with its
    patches' updates; the comparison names the test the series changes without updating it, and only that one."""
    _restat(queue / "patches" / "0002-fix-a.patch")
    patch_dir = queue / "patches"
    names, left_out = upstream_tests.tree_patches("compat", patch_dir)
    assert names == ["0001-compat-thing.patch"] and list(left_out) == ["0004-compat-port-a.patch"]
    assert "every line it changes is one the fix patches add" in left_out["0004-compat-port-a.patch"]

    # the tag's tests come from its git directory or from an extracted tree
    from_git = tmp_path / "from-git"
    assert "git archive" in upstream_tests.extract_tests(tag / ".git", from_git)
    assert (from_git / UPSTREAM_TEST).read_text() == THING and (from_git / "setup.cfg").read_text() == SETUP_CFG
    from_tree = tmp_path / "from-tree"
    shutil.copytree(from_git / "tests", tmp_path / "extracted" / "tests")
    upstream_tests.extract_tests(tmp_path / "extracted" / "tests", from_tree)
    assert (from_tree / UPSTREAM_TEST).read_text() == THING

    build = tmp_path / "build"
    runs = {}
    for tree in upstream_tests.TREES:
        built = upstream_tests.build_tree(tree, from_git, build, patch_dir)
        runs[tree] = upstream_tests.run_tree(built, ["tests_pytorch"], test_timeout=120, timeout=600)
        assert not runs[tree]["timed_out"]
    assert "FIX_A" not in (build / "compat" / PL_TPU).read_text()
    assert "FIX_A = 1  # ported" in (build / "series" / PL_TPU).read_text()
    assert (build / "compat" / UPSTREAM_TEST).read_text() == THING
    assert 'assert "FIX_A = 1" in TPU.read_text()' in (build / "series" / UPSTREAM_TEST).read_text()

    out = tmp_path / "result.json"
    first = upstream_tests.report(build, ["tests_pytorch"], runs, "synthetic", None, patch_dir)
    # the differing test runs once more on each tree: it fails again on the series, so it is no flaky test
    upstream_tests.rerun_differences(build, first["differences"], 1, test_timeout=120, timeout=600)
    assert (build / "series" / "rerun-1.xml").exists()
    result = upstream_tests.report(build, ["tests_pytorch"], runs, "synthetic", out, patch_dir)
    assert result["trees"]["compat"]["counts"] == {"passed": 3}
    assert result["trees"]["series"]["counts"] == {"failed": 1, "passed": 2}
    assert result["trees"]["compat"]["left_out"] == left_out
    assert result["updated_on_purpose"] == {UPSTREAM_TEST: {"test_changed_on_purpose": ["0002-fix-a.patch"]}}
    assert [(d["test"], d["compat"], d["series"]) for d in result["differences"]] == [
        ("tests.tests_pytorch.test_thing::test_changed_by_accident", "passed", "failed")]
    assert result["differences"][0]["runs"] == {"compat": ["passed", "passed"], "series": ["failed", "failed"]}
    assert not result["differences"][0]["flaky"]
    assert result["unexplained"] == ["tests.tests_pytorch.test_thing::test_changed_by_accident"]
    assert result["same"] == 2 and out.exists()
    said = upstream_tests.summary(result).splitlines()
    at = said.index("    tests.tests_pytorch.test_thing::test_changed_by_accident: compat passed, series failed; runs "
                    "compat passed/passed, series failed/failed")
    # an unexplained difference carries the series' message: in CI the summary is all that is left of the run
    assert said[at + 1].startswith("      series said: ") and "assert" in said[at + 1], said[at + 1]


def _outcomes(**by_key):
    return {key: {"outcome": outcome, "file": "tests/tests_lite/t.py", "message": ""} for key, outcome in by_key.items()}


def test_compare_tells_flaky_tests_and_updates_from_changes():
    results = {"compat": _outcomes(**{"tests.tests_lite.t::test_a": "passed", "tests.tests_lite.t::test_b": "passed",
                                      "tests.tests_lite.t::test_c": "passed", "tests.tests_lite.t::test_d": "passed",
                                      "tests.tests_lite.t::test_e": "failed"}),
               "series": _outcomes(**{"tests.tests_lite.t::test_a": "failed", "tests.tests_lite.t::test_b": "failed",
                                      "tests.tests_lite.t::test_c": "passed", "tests.tests_lite.t::test_d": "failed",
                                      "tests.tests_lite.t::test_e": "passed"})}
    reruns = {"compat": [_outcomes(**{"tests.tests_lite.t::test_a": "failed", "tests.tests_lite.t::test_b": "passed"})],
              "series": [_outcomes(**{"tests.tests_lite.t::test_a": "passed", "tests.tests_lite.t::test_b": "failed"})]}
    updated = {"tests/tests_lite/t.py": {"test_d": ["0009-x.patch"]}}
    compared = upstream_tests.compare(results, updated, reruns)
    by_test = {d["test"].rsplit("::", 1)[1]: d for d in compared["differences"]}
    assert sorted(by_test) == ["test_a", "test_b", "test_d", "test_e"]
    # test_e fails on the compat tree and passes on the series: the series fixed it, nothing to explain
    assert by_test["test_e"]["improved"] and compared["improved"] == ["tests.tests_lite.t::test_e"]
    # test_a gave both outcomes on both trees: flaky; test_b failed every time on the series: a change
    assert by_test["test_a"]["flaky"] and by_test["test_a"]["runs"] == {"compat": ["passed", "failed"],
                                                                        "series": ["failed", "passed"]}
    assert not by_test["test_b"]["flaky"]
    # an updated test must pass on the series to count as updated on purpose
    assert by_test["test_d"]["updated_by"] == ["0009-x.patch"] and not by_test["test_d"]["on_purpose"]
    assert compared["unexplained"] == ["tests.tests_lite.t::test_b", "tests.tests_lite.t::test_d"]
    assert compared["same"] == 1
    assert upstream_tests.node_id("tests.tests_lite.t.TestX::test_y[1]", "tests/tests_lite/t.py") == \
        "tests/tests_lite/t.py::TestX::test_y[1]"
    assert upstream_tests.node_id("tests.tests_lite.broken", "") is None


def test_a_test_upstream_never_passes_is_improved_once_the_series_passes_it_in_some_run():
    """CI met upstream's LBFGS test erroring once on the series and passing on its rerun, where the compat tree fails
    it: no drop-in broke, so it is improved, and the summary says not every run passed; erroring in every run on the
    series stays a difference to explain, and so does one the compat tree passed once."""
    results = {"compat": _outcomes(**{"tests.tests_lite.t::test_f": "failed", "tests.tests_lite.t::test_g": "failed",
                                      "tests.tests_lite.t::test_h": "failed"}),
               "series": _outcomes(**{"tests.tests_lite.t::test_f": "error", "tests.tests_lite.t::test_g": "error",
                                      "tests.tests_lite.t::test_h": "error"})}
    reruns = {"compat": [_outcomes(**{"tests.tests_lite.t::test_f": "failed", "tests.tests_lite.t::test_g": "failed",
                                      "tests.tests_lite.t::test_h": "passed"})],
              "series": [_outcomes(**{"tests.tests_lite.t::test_f": "passed", "tests.tests_lite.t::test_g": "error",
                                      "tests.tests_lite.t::test_h": "passed"})]}
    compared = upstream_tests.compare(results, {}, reruns)
    assert compared["improved"] == ["tests.tests_lite.t::test_f"]
    # test_h passed on both trees in the reruns: flaky, as before
    assert compared["unexplained"] == ["tests.tests_lite.t::test_g"]
    result = {"tag": "1.8.6", "dirs": ["tests_lite"], "same": 0,
              "trees": {tree: {"patches": [], "counts": {}} for tree in upstream_tests.TREES}, **compared}
    assert ("    tests.tests_lite.t::test_f: compat failed, series error; runs compat failed/failed, series error/passed "
            "(improved; not every run on the series passed)") in upstream_tests.summary(result).splitlines()


def _compat_tree_run(queue, tag, tmp_path):
    """The synthetic queue's compat tree built under ``tmp_path/full`` and run once: ``(patch dir, build dir)``."""
    _restat(queue / "patches" / "0002-fix-a.patch")
    patch_dir = queue / "patches"
    from_git = tmp_path / "from-git"
    upstream_tests.extract_tests(tag / ".git", from_git)
    full = tmp_path / "full"
    compat = upstream_tests.build_tree("compat", from_git, full, patch_dir)
    assert not upstream_tests.run_tree(compat, ["tests_pytorch"], test_timeout=120, timeout=600)["timed_out"]
    return patch_dir, full


@RunIf(xla=True)
def test_the_series_on_xla_against_a_committed_compat_baseline(queue, tag, tmp_path):
    """``make upstream-tests-xla-check`` (CI): the compat tree's outcomes come from the baseline a full run wrote, the
    series alone runs (on XLA, with the plugin), and the test the series changes by accident is the one difference,
    with the command that writes the baseline again in the failure's advice."""
    patch_dir, full = _compat_tree_run(queue, tag, tmp_path)
    upstream_tests.rerun_differences(full, [{"test": "tests.tests_pytorch.test_thing::test_unchanged",
                                             "file": UPSTREAM_TEST}], 1, 120, 600, trees=("compat",))
    baseline_file = tmp_path / "baseline.json"
    baseline = upstream_tests.write_baseline(full, ["tests_pytorch"], baseline_file)
    # a rerun runs the differing test's whole module, in its order: every test of it has a second run
    assert {k: v["runs"] for k, v in baseline["outcomes"].items()} == {
        "tests.tests_pytorch.test_thing::test_unchanged": ["passed", "passed"],
        "tests.tests_pytorch.test_thing::test_changed_on_purpose": ["passed", "passed"],
        "tests.tests_pytorch.test_thing::test_changed_by_accident": ["passed", "passed"]}
    assert baseline["patches"] == ["0001-compat-thing.patch"] and baseline["dirs"] == ["tests_pytorch"]
    assert upstream_tests.REFRESH_XLA in baseline["written"]

    out = tmp_path / "result.json"
    build = tmp_path / "check"
    result = upstream_tests.check(tag / ".git", baseline_file, build, out, test_timeout=120, timeout=600, reruns=1,
                                  dirs=["tests_pytorch"],
                                  workers=0, log=lambda message: None, patch_dir=patch_dir)
    assert not (build / "compat").exists()  # the slow tree never runs in a check
    assert "-p fork_upstream_xla" in (build / "series" / "pytest.log").read_text().splitlines()[0]
    assert result["trees"]["compat"]["from_baseline"] == baseline["written"]
    assert result["trees"]["series"]["counts"] == {"failed": 1, "passed": 2}
    assert result["accelerator"].startswith("xla")
    assert [(d["test"], d["compat"], d["series"], d["runs"]) for d in result["differences"]] == [
        ("tests.tests_pytorch.test_thing::test_changed_by_accident", "passed", "failed",
         {"compat": ["passed", "passed"], "series": ["failed", "failed"]})]
    assert result["unexplained"] == ["tests.tests_pytorch.test_thing::test_changed_by_accident"]
    assert result["updated_on_purpose"] == {UPSTREAM_TEST: {"test_changed_on_purpose": ["0002-fix-a.patch"]}}
    assert json.loads(out.read_text())["unexplained"] == result["unexplained"]


LITE_TEST = '''import os

from lightning_lite import LightningLite


class Lite(LightningLite):
    def run(self):
        pass


def test_a_lite_that_names_no_accelerator_runs_on_xla():
    lite = Lite()
    assert lite.device.type == "xla"


def test_an_accelerator_the_test_names_wins():
    assert Lite(accelerator="cpu").device.type == "cpu"
    assert Lite("cpu").device.type == "cpu"


def test_torch_xla_variables_are_there_before_the_first_test():
    # upstream's restore_env_variables fixture snapshots the environment before each test
    assert os.environ.get("GRPC_VERBOSITY")
'''


@RunIf(xla=True)
def test_the_xla_plugin_puts_lightning_lite_on_xla(tmp_path):
    """The plugin gives LightningLite the Trainer's rule for environment defaults: a value applies only where the
    test does not pass the argument itself; torch_xla's own variables exist before any test."""
    (tmp_path / "test_lite_defaults.py").write_text(LITE_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRPC_", "PL_"))}
    env.update(upstream_tests.XLA_ENV, PJRT_DEVICE="CPU",
               PYTHONPATH=os.pathsep.join([str(upstream_tests.XLA_PLUGIN_DIR), env.get("PYTHONPATH", "")]))
    args = ["-p", upstream_tests.XLA_PLUGIN, "-q", "-p", "no:cacheprovider", str(tmp_path)]
    proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout
    # without the plugin, the same Lite stays on the CPU: the first test is what the plugin changes
    plain = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert "test_a_lite_that_names_no_accelerator_runs_on_xla FAILED" in plain.stdout or \
        "FAILED test_lite_defaults.py::test_a_lite_that_names_no_accelerator_runs_on_xla" in plain.stdout, plain.stdout


def test_a_test_left_out_on_the_compat_tree_is_a_difference_only_once_the_series_fails_it():
    results = {"compat": _outcomes(**{"tests.tests_lite.t::test_a": upstream_tests.NOT_RUN,
                                      "tests.tests_lite.t::test_b": upstream_tests.NOT_RUN,
                                      "tests.tests_lite.t::test_c": "failed"}),
               "series": _outcomes(**{"tests.tests_lite.t::test_a": "passed", "tests.tests_lite.t::test_b": "failed",
                                      "tests.tests_lite.t::test_c": "failed"})}
    compared = upstream_tests.compare(results, {})
    # test_a: the series still passes it; test_b: the series passed it when the compat tree left it out, and no more
    assert [(d["test"], d["compat"], d["series"]) for d in compared["differences"]] == [
        ("tests.tests_lite.t::test_b", upstream_tests.NOT_RUN, "failed")]
    assert compared["unexplained"] == ["tests.tests_lite.t::test_b"]
    assert compared["passed_on_series_not_run_on_compat"] == 1 and compared["same"] == 1
    # a rerun on the series that passes it says nothing of the compat tree, which never ran it: still unexplained
    again = upstream_tests.compare(results, {}, {"series": [_outcomes(**{"tests.tests_lite.t::test_b": "passed"})]})
    assert not again["differences"][0]["flaky"] and again["unexplained"] == ["tests.tests_lite.t::test_b"]
    # once the compat tree ran it (the check does, for a test the baseline left out) and it failed there too in some
    # run while the series passed it in some run, the two trees behave alike: flaky
    ran = upstream_tests.compare(results, {}, {"series": [_outcomes(**{"tests.tests_lite.t::test_b": "passed"})],
                                               "compat": [_outcomes(**{"tests.tests_lite.t::test_b": "failed"})]})
    assert ran["differences"][0]["flaky"] and ran["unexplained"] == []
    assert ran["differences"][0]["runs"]["compat"] == [upstream_tests.NOT_RUN, "failed"]


SELECTED = '''import pytest


@pytest.mark.parametrize("x", ["a b", "c::d", "e"])
def test_p(x):
    pass


class TestK:
    def test_m(self):
        pass

    def test_n(self):
        pass
'''


@RunIf(xla=True)
def test_the_xla_plugin_runs_the_tests_named_by_their_junit_keys(tmp_path):
    """Parametrized ids with a space or ``::`` select by their JUnit keys, which pytest's node ids cannot do safely."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_sel.py").write_text(SELECTED)
    only = tmp_path / "only.txt"
    only.write_text("tests.test_sel::test_p[a b]\ntests.test_sel::test_p[c::d]\ntests.test_sel.TestK::test_n\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PL_")}
    env.update(PYTHONPATH=os.pathsep.join([str(upstream_tests.XLA_PLUGIN_DIR), env.get("PYTHONPATH", "")]),
               **{upstream_tests.ONLY_ENV: str(only)})
    env.pop("PJRT_DEVICE", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", upstream_tests.XLA_PLUGIN, "-p", "no:cacheprovider",
                           "-v", "--junitxml", str(tmp_path / "j.xml"), "-o", "junit_family=xunit1", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert set(upstream_tests.read_outcomes(tmp_path / "j.xml")) == set(only.read_text().split("\n")[:-1])
    assert "3 passed, 2 deselected" in proc.stdout


@RunIf(xla=True)
def test_the_compat_tree_on_xla_runs_only_what_the_series_does_not_pass(queue, tag, tmp_path):
    """``--compat-scope not-passed``: the series runs first; the compat tree runs only its failing test, and the
    baseline keeps the tests it left out, which a later check compares as passing on the series before."""
    _restat(queue / "patches" / "0002-fix-a.patch")
    build, out, baseline_file = tmp_path / "build", tmp_path / "result.json", tmp_path / "baseline.json"
    result = upstream_tests.run(tag / ".git", ["tests_pytorch"], build, out, test_timeout=120, timeout=600,
                                reruns=1, log=lambda message: None, xla=True, baseline=baseline_file,
                                compat_scope="not-passed", patch_dir=queue / "patches")
    accident = "tests.tests_pytorch.test_thing::test_changed_by_accident"
    assert set(upstream_tests.read_outcomes(build / "compat" / "junit.xml")) == {accident}
    assert result["trees"]["compat"]["counts"] == {"passed": 1, upstream_tests.NOT_RUN: 2}
    assert result["passed_on_series_not_run_on_compat"] == 2
    assert result["unexplained"] == [accident]
    assert result["differences"][0]["runs"] == {"compat": ["passed", "passed"], "series": ["failed", "failed"]}
    baseline = json.loads(baseline_file.read_text())
    assert baseline["compat_scope"] == "not-passed"
    assert {k: v["outcome"] for k, v in baseline["outcomes"].items()} == {
        accident: "passed", "tests.tests_pytorch.test_thing::test_unchanged": upstream_tests.NOT_RUN,
        "tests.tests_pytorch.test_thing::test_changed_on_purpose": upstream_tests.NOT_RUN}
    with pytest.raises(common.ForkError, match="leave out --parallel"):
        upstream_tests.run(tag / ".git", ["tests_pytorch"], build, out, xla=True, parallel=True,
                           compat_scope="not-passed", patch_dir=queue / "patches")


def test_on_xla_only_the_compat_tree_reads_checkpoints_as_upstream_met_it(tmp_path, monkeypatch):
    """On XLA the compat tree (upstream's side) loads with torch's 2022 default wherever the caller does not choose;
    the series runs as users run it, with torch's default, so that a test's plain ``torch.load`` of what the series
    wrote shows what a user meets."""
    monkeypatch.setenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "1")  # would make torch refuse the pair
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # a developer's shell must not leak into the series
    compat = upstream_tests._env(tmp_path / "compat", xla=True)
    assert compat["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1" and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in compat
    series = upstream_tests._env(tmp_path / "series", xla=True)
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in series and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in series
    assert "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" not in upstream_tests._env(tmp_path / "compat", xla=False)


# the check runs upstream's tests on XLA: the torch_xla stack's
@RunIf(min_torch_xla="2.9")
def test_a_test_the_baseline_left_out_runs_on_the_compat_tree_before_it_is_called_anything(queue, tag, tmp_path):
    """The baseline left out a test the series passed then (`--compat-scope not-passed`); now the series fails it.
    A pass on some rerun of the series proves nothing of the compat tree: the check runs the test there first."""
    patch_dir, full = _compat_tree_run(queue, tag, tmp_path)
    baseline_file = tmp_path / "baseline.json"
    upstream_tests.write_baseline(full, ["tests_pytorch"], baseline_file)
    written = json.loads(baseline_file.read_text())
    left_out = "tests.tests_pytorch.test_thing::test_changed_by_accident"
    written["outcomes"][left_out].update(outcome=upstream_tests.NOT_RUN, runs=[upstream_tests.NOT_RUN])
    baseline_file.write_text(json.dumps(written))

    build = tmp_path / "check"
    result = upstream_tests.check(tag / ".git", baseline_file, build, tmp_path / "result.json", test_timeout=120,
                                  dirs=["tests_pytorch"],
                                  timeout=600, reruns=1, workers=0, log=lambda message: None, patch_dir=patch_dir)
    assert (build / "compat" / "rerun-1.xml").exists()  # the compat tree ran the module of the left-out test
    [difference] = result["differences"]
    assert difference["test"] == left_out
    assert difference["runs"] == {"compat": [upstream_tests.NOT_RUN, "passed"], "series": ["failed", "failed"]}
    assert not difference["flaky"] and result["unexplained"] == [left_out]


def _tests_diff(tag: Path, old: str, new: str) -> str:
    """A diff of upstream's test file in the synthetic tag that replaces ``old`` by ``new``."""
    path = tag / UPSTREAM_TEST
    path.write_text(THING.replace(old, new))
    try:
        return git(["diff", "--full-index"], tag)
    finally:
        git(["checkout", "--", UPSTREAM_TEST], tag)


def test_each_edit_of_upstream_s_tests_is_shown_needed_or_reported(tmp_path, tag):
    """An edit is needed when the series fails upstream's test without it and passes it with it; an edit that the
    series passes either way changes nothing the series needs, and is reported."""
    root = make_queue(tmp_path / "q", [
        {"name": "0001-fix-a.patch", "subject": "Fix A", "kind": "fix",
         "edit": combine(append(PL_TPU, "FIX_A = 1\n"), _changelog("Fixed A"))},
        {"name": "0002-fix-b.patch", "subject": "Fix B", "kind": "fix",
         "edit": combine(append(LITE_TPU, "FIX_B = 2\n"), _changelog("Fixed B"))},
    ])
    fix_a, fix_b = root / "patches" / "0001-fix-a.patch", root / "patches" / "0002-fix-b.patch"
    fix_a.write_text(fix_a.read_text() + _test_update(tag))
    fix_b.write_text(fix_b.read_text() + _tests_diff(tag, "    assert TPU.exists()\n",
                                                      "    # the file is there\n    assert TPU.exists()\n"))
    for patch in (fix_a, fix_b):
        _restat(patch)
    result = test_edits.check(tag / ".git", ["cpu"], tmp_path / "build", tmp_path / "edits.json", test_timeout=120,
                              timeout=600, workers=0, log=lambda message: None, patch_dir=root / "patches")
    assert {(e["patch"], e["test"]): e["verdict"] for e in result["edits"]} == {
        ("0001-fix-a.patch", "test_changed_on_purpose"): "needed",
        ("0002-fix-b.patch", "test_unchanged"): "not needed"}
    needed = result["edits"][0]
    assert needed["outcomes"]["cpu"] == {"edited": {"passed": 1}, "unedited": {"failed": 1}}
    assert [p.split(":")[0] for p in test_edits.problems(result)] == ["0002-fix-b.patch"]
    assert json.loads((tmp_path / "edits.json").read_text())["counts"] == {"needed": 1, "not needed": 1}


def test_an_edit_names_the_tests_it_changes():
    """A changed line belongs to the definition around it; a decorator or comment above a test to that test; a line
    outside any definition to the whole module."""
    section = '''diff --git a/tests/t/test_x.py b/tests/t/test_x.py
--- a/tests/t/test_x.py
+++ b/tests/t/test_x.py
@@ -1,3 +1,3 @@
-import warnings
+import warnings  # noqa
 
 
@@ -10,7 +10,8 @@ def test_before(tmpdir):
     assert True
 
 
-@RunIf(min_torch="1.10")
+# why
+@RunIf(min_torch="1.10", max_torch="2.1.0")
 def test_limited():
     pass
@@ -30,4 +31,4 @@ class Model(BoringModel):
     def training_step(self, batch, batch_idx):
-        return 1
+        return 2
'''
    assert test_edits.changed_definitions(section) == ["*", "test_limited", "Model"]
    # a constant of the module after a test belongs to the module, not to the test the hunk header names
    shared = """@@ -779,7 +779,7 @@ def test_before(tmpdir):
     assert True
 
 
-inputs0 = ([1], RunningStage.TESTING)
+inputs0 = ([1], RunningStage.TESTING.value)
"""
    assert test_edits.changed_definitions(shared) == ["*"]


def test_a_decorator_far_above_its_test_belongs_to_that_test_as_the_module_says():
    """A decorator whose test is beyond the hunk (a long ``parametrize`` between them) belongs to the test below it in
    the module, not to the test the hunk header names (what once attributed two edits of the fault-tolerant refusal
    to the wrong tests)."""
    source = "\n".join([
        "def test_before():",  # 1
        "    pass",
        "",
        "",
        '@mock.patch.dict(os.environ, {"A": "1"})',  # 5
        "@pytest.mark.parametrize(",
        '    "x",',
        "    [1, 2, 3],",
        ")",
        "def test_after(x):",  # 10
        "    pass",
    ]) + "\n"
    section = """@@ -2,7 +2,7 @@ def test_before():
     pass
 
 
-@mock.patch.dict(os.environ, {"A": "1"})
+@mock.patch.dict(os.environ, {"A": "1", "B": "2"})
 @pytest.mark.parametrize(
     "x",
     [1, 2, 3],
"""
    assert test_edits.changed_definitions(section, source) == ["test_after"]
    # without the module, only the hunk: the name in its header
    assert test_edits.changed_definitions(section) == ["test_before"]


def test_an_edit_s_verdict_compares_its_tests_one_by_one():
    """A module that does not load as upstream wrote it fails each of its tests; a test that fails with and without
    the edit says nothing of it; one that the edit breaks outweighs one it mends."""
    edited = {"tests.t::test_a": "passed", "tests.t::test_b[1]": "failed"}
    assert test_edits.mode_verdict(edited, {"tests.t": "error"}) == "needed"
    assert test_edits.mode_verdict(edited, {"tests.t::test_a": "failed", "tests.t::test_b[1]": "failed"}) == "needed"
    assert test_edits.mode_verdict(edited, {"tests.t::test_a": "passed", "tests.t::test_b[1]": "failed"}) == (
        "not needed")
    assert test_edits.mode_verdict({"tests.t::test_b[1]": "failed"}, {"tests.t::test_b[1]": "timeout"}) == (
        "fails either way")
    assert test_edits.mode_verdict(edited, {"tests.t::test_a": "failed", "tests.t::test_b[1]": "passed"}) == (
        "edited fails")
    assert test_edits.mode_verdict({"tests.t::test_a": "skipped"}, {"tests.t::test_a": "skipped"}) == "not run here"
    # an expected failure fails whatever made it fail: it does not make an edit "not needed" (upstream's xfailed
    # parametrizations of a test whose other ones fail either way)
    xfail_and_failing = {"tests.t::test_c[0.5]": "xfailed", "tests.t::test_c[1.0]": "failed"}
    assert test_edits.mode_verdict(xfail_and_failing, dict(xfail_and_failing)) == "fails either way"
    assert test_edits.mode_verdict({"tests.t::test_c[0.5]": "xfailed"}, {"tests.t::test_c[0.5]": "xfailed"}) == (
        "not run here")
    assert test_edits.verdict({"cpu": "not needed", "xla": "needed"}) == "needed"
    assert test_edits.verdict({"cpu": "needed", "xla": "edited fails"}) == "edited fails"
