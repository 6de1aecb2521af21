"""patches/2.6.6: well-formed mbox patches that ``git am`` takes in order on the pinned Lightning 2.6.6 tree."""
import json
import subprocess
from pathlib import Path

import pytest

from forkq import common, patchfile
from forkq.series import pr266 as series


GOOD_BODY = "What was wrong:\n\n" + "A defect, described at the length of a pull request description.\n" * 4
DIFF = """diff --git a/src/lightning/fabric/x.py b/src/lightning/fabric/x.py
--- a/src/lightning/fabric/x.py
+++ b/src/lightning/fabric/x.py
@@ -1 +1 @@
-A = 1
+A = 2
diff --git a/src/lightning/fabric/CHANGELOG.md b/src/lightning/fabric/CHANGELOG.md
--- a/src/lightning/fabric/CHANGELOG.md
+++ b/src/lightning/fabric/CHANGELOG.md
@@ -1 +1,2 @@
 ### Fixed
+- Fixed A
diff --git a/tests/tests_fabric/test_x.py b/tests/tests_fabric/test_x.py
new file mode 100644
--- /dev/null
+++ b/tests/tests_fabric/test_x.py
@@ -0,0 +1,7 @@
+def helper():
+    pass
+
+
+def test_a():
+    pass
+class TestB:
"""


FIELDS = "Forwarded: no\nOrigin: vendor\n"


def _mbox(author: str = common.AUTHOR, body: str = GOOD_BODY, diff: str = DIFF) -> str:
    return (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: {author}\n"
            f"Date: Mon, 30 Nov 2026 07:00:00 +0000\nSubject: [PATCH] Fix A\n\n{body}\n{FIELDS}---\n x | 1 +\n\n"
            f"{diff}")


def test_the_series_is_well_formed():
    names = series.read_series()
    assert names, "patches/2.6.6/series lists no patch"
    assert series.check_series() == []
    for name in names:
        assert series.added_tests(series.PATCH_DIR.joinpath(name).read_text()), f"{name} adds no test"


def test_the_check_finds_what_is_wrong_with_a_patch(tmp_path):
    (tmp_path / "0001-good.patch").write_text(_mbox())
    (tmp_path / "0002-bad.patch").write_text(_mbox(author="Someone <someone@example.com>", body="Fix.\n",
                                                   diff=DIFF.replace("tests/tests_fabric/", "elsewhere/")))
    (tmp_path / "0003-unlisted.patch").write_text(_mbox())
    (tmp_path / "series").write_text("# comment\n0001-good.patch\n0002-bad.patch  # trailing comment\n")
    problems = series.check_series(tmp_path)
    assert not [p for p in problems if p.startswith("0001-good.patch")]
    bad = [p for p in problems if p.startswith("0002-bad.patch")]
    assert any("author" in p for p in bad)
    assert any("PR description" in p for p in bad)
    assert any("outside upstream" in p for p in bad)
    assert any("adds no test" in p for p in bad)
    assert any(p.startswith("0003-unlisted.patch") and "not in its series" in p for p in problems)


def test_added_tests_are_read_from_the_diff():
    module = "tests/tests_fabric/test_x.py"
    assert series.added_tests(_mbox()) == [f"{module}::test_a", f"{module}::TestB"]


@pytest.fixture(scope="module")
def pinned_tree(tmp_path_factory) -> Path:
    try:
        return series.base_tree(tmp_path_factory.mktemp("l266") / "lightning")
    except series.ForkError as err:
        # no network or no index: nothing to check against. A hash mismatch is an error, never a skip
        if str(err).startswith(("could not download", "the download of")):
            pytest.skip(f"the pinned lightning 2.6.6 wheel cannot be downloaded here: {err}")
        raise


def test_the_pinned_tree_is_upstreams_layout(pinned_tree):
    assert (pinned_tree / "src" / "lightning" / "fabric" / "CHANGELOG.md").is_file()
    assert (pinned_tree / "src" / "lightning" / "pytorch" / "plugins" / "precision" / "xla.py").is_file()
    tag = subprocess.run(["git", "tag"], cwd=pinned_tree, capture_output=True, text=True, check=True).stdout.split()
    assert tag == [series.TAG]


def test_the_series_applies_in_order_with_git_am(pinned_tree):
    names = series.read_series()
    for name in names:
        series.git_am(pinned_tree, series.PATCH_DIR / name)
    subjects = subprocess.run(["git", "log", "--reverse", "--format=%s", f"{series.TAG}..HEAD"], cwd=pinned_tree,
                              capture_output=True, text=True, check=True).stdout.splitlines()
    assert subjects == [patchfile.Patch.read(series.PATCH_DIR / n).subject for n in names]


def test_the_recorded_verification_flips_and_the_document_shows_every_patch():
    names = series.read_series()
    verified = json.loads(series.VERIFIED_JSON.read_text())
    recorded = {p["name"]: p for p in verified["patches"]}
    assert set(recorded) <= set(names), "verified.json records a patch that the series no longer has"
    for name, record in recorded.items():
        assert record["flipped"], f"{name}: its tests did not fail without it and pass with it"
        assert record["before"]["passed"] == 0 and record["after"]["passed"] > 0
    doc = series.render_doc_section()
    assert doc.startswith("## Lightning 2.6.6 (the current line)")
    for name in names:
        assert f"patches/2.6.6/{name}" in doc


def test_a_wheel_that_does_not_match_the_pinned_hash_is_refused(tmp_path):
    lock = json.loads((series.ROOT / "upstream.lock").read_text())
    entry = lock[series.LOCK_KEY]
    assert entry["filename"] == "lightning-2.6.6-py3-none-any.whl"
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / entry["filename"]).write_bytes(b"not the wheel")
    with pytest.raises(series.ForkError, match="sha256 mismatch"):
        series.base_tree(tmp_path / "tree", cache_dir=cache)
    assert not (tmp_path / "tree").exists()
