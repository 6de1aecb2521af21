"""make pr-series: the fix patches as a git am series for upstream 1.8.6, with their tests and CHANGELOG entries."""
import ast
import re
import tempfile
from pathlib import Path

import pytest

from forkq import common, patchfile, seriesfile, tree, upstream
from forkq.common import ForkError
from forkq.series.pr186.export import export
from forkq.series.pr186.testmodules import export_helper, export_test, fix_tests, fork_helpers
from forkq.series.pr186.verify import upstream_repo
from tests_fork.synthetic import append, combine, git, make_queue, replace


PL_TPU = "src/pytorch_lightning/plugins/precision/tpu.py"
LITE_TPU = "src/lightning_lite/plugins/precision/tpu.py"
PL_CHANGELOG = "src/pytorch_lightning/CHANGELOG.md"
LITE_CHANGELOG = "src/lightning_lite/CHANGELOG.md"
CALL = 'closure_result = xm.optimizer_step(optimizer, optimizer_args={"closure": closure, **kwargs})'
HEADER = "## [1.8.6] - 2022-12-21\n\n"

TEST_A = '''"""Tests of fix A."""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0002-fix-a.patch"


@RunIf(xla=True)
def test_fix_a_marker():
    from pytorch_lightning.plugins.precision import tpu

    assert tpu.FIX_A == 1
'''

TEST_B = '''from helpers.runif import RunIf
FIXED_BY = "0003-fix-b.patch"  # the fix this module proves


@RunIf(tpu=True, standalone=True)
def test_fix_b_marker():
    from lightning_lite.plugins.precision import tpu

    assert tpu.FIX_B == 2
'''


def _changelog(entry: str, path: str):
    return replace(path, HEADER, f"{HEADER}### Fixed\n\n- {entry}\n\n")


def _queue(root: Path, dependent: bool = False, feature: bool = False) -> Path:
    compat = {"name": "0001-compat-thing.patch", "subject": "Compat thing", "kind": "compat",
              "edit": append("src/pytorch_lightning/__about__.py", "COMPAT = 1\n")}
    if dependent:
        # the compat patch rewrites the optimizer_step call, and the fix is made on top of that rewrite
        compat["edit"] = replace(PL_TPU, CALL, CALL.replace("closure_result", "compat_result") + "\n        closure_result = compat_result")
    fix_a_edit = combine(append(PL_TPU, "FIX_A = 1\n"), _changelog("Fixed A ([#111](https://example.com/111))", PL_CHANGELOG))
    if dependent:
        fix_a_edit = combine(replace(PL_TPU, "compat_result = xm.optimizer_step(optimizer,",
                                     "compat_result = xm.optimizer_step(optimizer,  # fixed\n           "),
                             _changelog("Fixed A", PL_CHANGELOG))
    queue = make_queue(root, [
        compat,
        {"name": "0002-fix-a.patch", "subject": "Fix A in the TPU precision plugin", "kind": "fix",
         "bug": "https://github.com/Lightning-AI/lightning/issues/111", "edit": fix_a_edit,
         "body": "A was wrong because of reasons that this body explains at length, and the fix does this."},
        {"name": "0003-fix-b.patch", "subject": "Fix B in Lite", "kind": "fix", "bug": "none",
         "edit": combine(append(LITE_TPU, "FIX_B = 2\n"), _changelog("Fixed B", LITE_CHANGELOG))},
    ] + ([
        # a feature of the fork's own, on the file fix A changes too
        {"name": "0004-feature-c.patch", "subject": "Add feature C", "kind": "feature", "bug": "none",
         "edit": append(PL_TPU, "FEATURE_C = 3\n")},
    ] if feature else []))
    tests = root / "tests"
    (tests / "tests_pytorch" / "plugins" / "precision").mkdir(parents=True)
    (tests / "tests_pytorch" / "plugins" / "precision" / "test_fix_a.py").write_text(TEST_A)
    (tests / "tests_lite").mkdir(parents=True)
    (tests / "tests_lite" / "test_fix_b.py").write_text(TEST_B)
    (tests / "tests_lite" / "test_unrelated.py").write_text("def test_x():\n    assert True\n")
    if feature:
        (tests / "tests_lite" / "test_feature_c.py").write_text(
            'FIXED_BY = "0004-feature-c.patch"\n\n\ndef test_c():\n    assert True\n')
    return queue


def _export(queue: Path, out: Path, doc=None):
    return export(out, doc, patch_dir=queue / "patches", tests_root=queue / "tests",
                            lock_file=queue / "upstream.lock")


def test_export_applies_to_pure_upstream_and_equals_the_fixes(tmp_path):
    queue = _queue(tmp_path / "q")
    out, doc = tmp_path / "pr-series", tmp_path / "upstream-prs.md"
    mboxes = _export(queue, out, doc)
    assert [m.name for m in mboxes] == ["0001-fix-a.patch", "0002-fix-b.patch"]
    assert (out / "series").read_text() == "0001-fix-a.patch\n0002-fix-b.patch\n"

    # git am on a repository of the pinned upstream tree: in order, without conflict
    repo = upstream_repo(tmp_path / "upstream", upstream.read_lock(), common.CACHE_DIR)
    for m in mboxes:
        git(["am", "-q", str(m)], repo)
    log = git(["log", "--format=%s", "1.8.6..HEAD"], repo).split("\n")
    assert log[:2] == ["Fix B in Lite", "Fix A in the TPU precision plugin"]
    message = git(["log", "-1", "--format=%B", "HEAD~1"], repo)
    assert "Bug: https://github.com/Lightning-AI/lightning/issues/111" in message
    assert "Kind:" not in message and "Origin:" not in message

    # the sources equal upstream + the fix patches only (no compat change leaks in)
    fixes_only = tmp_path / "fixes-only"
    fixes_only.mkdir()
    for name in ("0002-fix-a.patch", "0003-fix-b.patch"):
        (fixes_only / name).write_text((queue / "patches" / name).read_text())
    (fixes_only / "series").write_text("0002-fix-a.patch\n0003-fix-b.patch\n")
    src = tree.materialize(tmp_path / "ref" / "src", patch_dir=fixes_only, lock_file=queue / "upstream.lock",
                           quiet=True)
    for path in (PL_TPU, LITE_TPU, PL_CHANGELOG, LITE_CHANGELOG, "src/pytorch_lightning/__about__.py"):
        assert (repo / path).read_bytes() == (src.parent / path).read_bytes(), path
    assert "COMPAT" not in (repo / "src/pytorch_lightning/__about__.py").read_text()
    assert "- Fixed A ([#111]" in (repo / PL_CHANGELOG).read_text()

    # the tests sit where upstream keeps them, with upstream's helper imports and without FIXED_BY
    test_a = (repo / "tests/tests_pytorch/plugins/precision/test_fix_a.py").read_text()
    assert "from tests_pytorch.helpers.runif import RunIf" in test_a
    assert "FIXED_BY" not in test_a and "@RunIf(tpu=True)" in test_a
    assert test_a.replace("from tests_pytorch.helpers.runif", "from helpers.runif").replace("tpu=True", "xla=True") \
        == TEST_A.replace('FIXED_BY = "0002-fix-a.patch"\n\n', "")
    test_b = (repo / "tests/tests_lite/test_fix_b.py").read_text()
    assert test_b.startswith("from tests_lite.helpers.runif import RunIf\n\n\n@RunIf(tpu=True, standalone=True)")
    assert not (repo / "tests/tests_lite/test_unrelated.py").exists()
    # each test module travels in its own fix's patch
    assert "tests/tests_pytorch/plugins/precision/test_fix_a.py" in mboxes[0].read_text()
    assert "tests/tests_lite/test_fix_b.py" not in mboxes[0].read_text()

    text = doc.read_text()
    assert "### 1.8.6-1. Fix A in the TPU precision plugin" in text and "### 1.8.6-2. Fix B in Lite" in text
    assert "https://github.com/Lightning-AI/lightning/issues/111" in text
    assert "`test_fix_a_marker`" in text and "`test_fix_b_marker`" in text
    assert "Fixed A ([#111](https://example.com/111))" in text
    assert "reasons that this body explains" in text
    # fix B's CHANGELOG is lite's, so both PRs apply to the tag on their own
    assert text.count("on its own: yes") == 2


def test_features_are_not_exported_as_upstream_fixes(tmp_path):
    """``Kind: feature`` patches (the SPMD strategies) are the fork's own: the series for upstream holds only the
    fixes, and a feature changing a file that a fix changes is not taken for a compat patch the fix needs."""
    queue = _queue(tmp_path / "q", feature=True)
    out, doc = tmp_path / "pr-series", tmp_path / "upstream-prs.md"
    mboxes = _export(queue, out, doc)
    assert [m.name for m in mboxes] == ["0001-fix-a.patch", "0002-fix-b.patch"]
    assert all("FEATURE_C" not in m.read_text() and "test_feature_c" not in m.read_text() for m in mboxes)
    text = doc.read_text()
    assert "Add feature C" not in text and "0004-feature-c" not in text
    assert text.count("on its own: yes") == 2


def test_fix_that_needs_a_compat_patch_is_reported(tmp_path):
    queue = _queue(tmp_path / "q", dependent=True)
    # the real series itself is consistent
    tree.materialize(tmp_path / "full" / "src", patch_dir=queue / "patches", lock_file=queue / "upstream.lock",
                     quiet=True)
    out = tmp_path / "pr-series"
    with pytest.raises(ForkError) as err:
        _export(queue, out)
    message = str(err.value)
    assert "0002-fix-a.patch does not apply to upstream 1.8.6" in message
    assert "compat patch(es): 0001-compat-thing.patch (also changes src/pytorch_lightning/plugins/precision/tpu.py)" \
        in message
    assert "0003-fix-b.patch" not in message  # the independent fix is fine
    assert not out.exists()


def test_fixed_by_naming_no_fix_is_an_error(tmp_path):
    queue = _queue(tmp_path / "q")
    (queue / "tests" / "tests_lite" / "test_stray.py").write_text('FIXED_BY = "0001-compat-thing.patch"\n')
    with pytest.raises(ForkError, match="test_stray.py: FIXED_BY names '0001-compat-thing.patch'"):
        _export(queue, tmp_path / "out")


@pytest.fixture(scope="module")
def real_export(computed_once):
    """The real series exported once per session (the ``computed_once`` fixture), for the tests that read it:
    ``(mboxes, doc)``. ``export`` raises when a fix needs a compat patch's context or ``git am`` fails."""

    def export_once(folder):
        mboxes = export(folder / "pr-series", folder / "upstream-prs.md")
        return [[str(m) for m in mboxes], str(folder / "upstream-prs.md")]

    mboxes, doc = computed_once("pr-series-real-export", export_once)
    return [Path(m) for m in mboxes], Path(doc)


def test_real_series_exports(real_export):
    names = seriesfile.read_series()
    kinds = [patchfile.Patch.read(common.PATCH_DIR / n).kind for n in names]
    if "fix" not in kinds:
        pytest.skip("patches/1.8.6/series holds no fix patch yet")
    mboxes, _ = real_export
    assert len(mboxes) == kinds.count("fix")
    tests = fix_tests(common.ROOT / "tests")
    fixes = [n for n, k in zip(names, kinds) if k == "fix"]
    for name, mbox in zip(fixes, mboxes):
        text = mbox.read_text()
        for test in tests.get(name, []):
            assert f"b/tests/{test.relative_to(common.ROOT / 'tests').as_posix()}" in text
        assert "FIXED_BY" not in text
        assert "from helpers." not in text and "from helpers import" not in text
        assert "mark.guard" not in text and "mark.slow" not in text  # fork-only markers: upstream's --strict-markers
    # every exported test module parses, and one that asks for `xla_metrics` defines it on top of an exported helper
    for mbox in mboxes:
        for path, content in _added_files(mbox.read_text()).items():
            if not path.endswith(".py"):
                continue
            ast.parse(content, filename=path)
            if re.search(r"def test\w*\([^)]*\bxla_metrics\b", content):
                assert "\ndef xla_metrics():" in content, path
                assert "helpers.xla_metrics import XLACounters" in content, path


def _added_files(mbox: str) -> dict:
    """``{path: content}`` of the files a patch creates."""
    files = {}
    for block in re.split(r"^diff --git ", mbox, flags=re.M)[1:]:
        if "\nnew file mode" not in block.split("@@", 1)[0]:
            continue
        path = block.split()[1][2:]
        body = block.split("@@", 2)[2].split("\n", 1)[1] if block.count("@@") >= 2 else ""
        files[path] = "".join(line[1:] + "\n" for line in body.splitlines() if line.startswith("+"))
    return files


def test_export_drops_fork_markers_and_brings_its_fixture():
    text = (
        '"""Doc."""\nimport torch\n\nfrom helpers.runif import RunIf\n\nFIXED_BY = "0009-x.patch"\n\n\n'
        "@pytest.mark.guard  # right before the fix too\n@RunIf(xla=True)\ndef test_a(xla_metrics):\n"
        "    assert xla_metrics.executions() == 1\n\n\n@pytest.mark.slow\n"
        "@pytest.mark.parametrize('x', [pytest.param(1, id='one', marks=pytest.mark.guard), 2])\n"
        "def test_b(x):\n    assert x\n\n\ndef test_c(tmp_path, fork_server):\n"
        "    run_scenario('a', str(tmp_path), env={},\n                 fork_server=fork_server)\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "tests"
        module = root / "tests_pytorch" / "test_x.py"
        module.parent.mkdir(parents=True)
        module.write_text(text)
        (root / "helpers").mkdir()
        (root / "helpers" / "xla_metrics.py").write_text("class XLACounters:\n    pass\n")
        path, out, warnings = export_test(module, root)
        helpers = fork_helpers(module, root)
    assert path == "tests/tests_pytorch/test_x.py" and warnings == []
    assert "mark.guard" not in out and "mark.slow" not in out and "FIXED_BY" not in out
    assert "    # right before the fix too\n" not in out and "# right before the fix too\n@RunIf(tpu=True)" in out
    assert "pytest.param(1, id='one')" in out
    assert "import pytest\nfrom tests_pytorch.helpers.xla_metrics import XLACounters\n" in out
    assert "\n@pytest.fixture\ndef xla_metrics():" in out
    # the fork's fork_server fixture only saves imports: upstream's test starts fresh interpreters
    assert "def test_c(tmp_path):\n    run_scenario('a', str(tmp_path), env={})\n" in out
    ast.parse(out)
    assert [h.name for h in helpers] == ["xla_metrics.py"]


def test_helpers_imported_as_modules_travel_with_the_test(tmp_path):
    root = tmp_path / "tests"
    (root / "helpers").mkdir(parents=True)
    (root / "helpers" / "worker.py").write_text("from helpers.transport import install\n")
    (root / "helpers" / "transport.py").write_text("def install():\n    pass\n")
    (root / "helpers" / "runif.py").write_text("")
    test = root / "tests_pytorch" / "test_two.py"
    test.parent.mkdir()
    test.write_text("from helpers import worker as w, runif\nfrom helpers.runif import RunIf\n")
    assert [h.name for h in fork_helpers(test, root)] == ["transport.py", "worker.py"]
    assert export_helper(root / "helpers" / "worker.py", test, root) == (
        "tests/tests_pytorch/helpers/worker.py", "from tests_pytorch.helpers.transport import install\n")


def test_committed_document_is_current(real_export):
    _, doc = real_export
    committed = common.ROOT / "docs" / "upstream-prs.md"
    assert committed.read_text() == doc.read_text(), "docs/upstream-prs.md is stale: run `make pr-series`"
