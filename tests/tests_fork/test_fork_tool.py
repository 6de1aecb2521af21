"""The fork tool: pinned upstream, hash check, atomic application of the series, up-to-patch trees."""
import json
import subprocess
import sys

import pytest
from packaging.version import Version

from forkq import authoring, common, patchfile, rules, seriesfile, tree
from tests_fork.upstream_queue import (  # noqa: F401 (fixtures)
    format_patch, materialize_queue, queue, REPO, TARGET, upstream_about)


def test_materialize_applies_the_whole_series(queue):
    src = materialize_queue(queue)
    about = (src / "pytorch_lightning" / "__about__.py").read_text()
    assert about.endswith("FIRST = 1\nSECOND = 2\n")
    assert (src / "lightning_lite" / "__init__.py").is_file()
    stamp = json.loads((src / tree.STAMP_NAME).read_text())
    assert stamp["patches"] == ["0001-first.patch", "0002-second.patch"] and stamp["complete"]
    # the fork's version is written into both packages and is a PEP 440 local version
    version = (src / "pytorch_lightning" / "__version__.py").read_text().split('"')[1]
    assert Version(version).public == "1.8.6" and Version(version).local.startswith("xla.2.g")
    assert (src / "lightning_lite" / "__version__.py").read_text() == f'version = "{version}"\n'


def test_materialize_is_idempotent_and_fast_when_nothing_changed(queue, capsys):
    src = materialize_queue(queue)
    stamp = src / tree.STAMP_NAME
    about = src / "pytorch_lightning" / "__about__.py"
    before = (stamp.stat().st_mtime_ns, about.stat().st_ino)
    tree.materialize(queue / "src", lock_file=queue / "upstream.lock", patch_dir=queue / "patches")
    assert "up to date" in capsys.readouterr().out
    assert (stamp.stat().st_mtime_ns, about.stat().st_ino) == before
    # a changed patch makes the next run rebuild from scratch
    (queue / "patches" / "0002-second.patch").write_text(
        (queue / "patches" / "0002-second.patch").read_text().replace("SECOND = 2", "SECOND = 3"))
    materialize_queue(queue)
    assert about.stat().st_ino != before[1]
    assert about.read_text().endswith("SECOND = 3\n")


def test_materialize_upto_a_named_patch(queue):
    src = materialize_queue(queue, upto="0001-first.patch")
    about = (src / "pytorch_lightning" / "__about__.py").read_text()
    assert about.endswith("FIRST = 1\n") and "SECOND" not in about
    assert json.loads((src / tree.STAMP_NAME).read_text())["upto"] == "0001-first.patch"
    assert "partial" in (src / "pytorch_lightning" / "__version__.py").read_text()
    # the number prefix works too, and "upstream" gives the pristine tree
    materialize_queue(queue, upto="0002")
    assert "SECOND" in (src / "pytorch_lightning" / "__about__.py").read_text()
    materialize_queue(queue, upto="upstream")
    assert "FIRST" not in (src / "pytorch_lightning" / "__about__.py").read_text()
    with pytest.raises(common.ForkError, match="matches no single patch"):
        materialize_queue(queue, upto="0009")


def test_hash_mismatch_is_a_hard_error_naming_both_hashes(queue):
    good = materialize_queue(queue)
    good_stamp = (good / tree.STAMP_NAME).read_text()
    lock = json.loads((queue / "upstream.lock").read_text())
    real = lock["pytorch-lightning"]["sha256"]
    lock["pytorch-lightning"]["sha256"] = "0" * 64
    (queue / "upstream.lock").write_text(json.dumps(lock))
    with pytest.raises(common.ForkError) as err:
        materialize_queue(queue)
    assert "0" * 64 in str(err.value) and real in str(err.value)
    # the good tree is left exactly as it was, and no staging folder is left behind
    assert (good / tree.STAMP_NAME).read_text() == good_stamp
    assert not list(queue.glob(".fork-staging-*"))


def test_hash_mismatch_on_a_fresh_checkout_leaves_no_tree(queue):
    lock = json.loads((queue / "upstream.lock").read_text())
    lock["pytorch-lightning"]["sha256"] = "f" * 64
    (queue / "upstream.lock").write_text(json.dumps(lock))
    with pytest.raises(common.ForkError, match="sha256 mismatch"):
        materialize_queue(queue)
    assert not (queue / "src").exists()


def test_a_patch_that_does_not_apply_names_itself_and_its_hunk(queue):
    good = materialize_queue(queue)
    good_about = (good / "pytorch_lightning" / "__about__.py").read_text()
    broken = (queue / "patches" / "0002-second.patch").read_text().replace("FIRST = 1", "FIRST = 42")
    (queue / "patches" / "0002-second.patch").write_text(broken)
    with pytest.raises(common.ForkError) as err:
        materialize_queue(queue)
    message = str(err.value)
    assert "0002-second.patch" in message
    assert f"patch failed: {TARGET}" in message
    # not half-applied: the previous good tree is still there, stamp and all, and a rerun still fails
    assert (good / "pytorch_lightning" / "__about__.py").read_text() == good_about
    assert json.loads((good / tree.STAMP_NAME).read_text())["patches"][-1] == "0002-second.patch"
    with pytest.raises(common.ForkError):
        materialize_queue(queue)
    assert not list(queue.glob(".fork-staging-*"))


def test_cli_exit_code_and_message_for_a_broken_lock(tmp_path):
    bad = tmp_path / "upstream.lock"
    bad.write_text('{"pytorch-lightning": {"version": "1.8.6", "filename": "x.whl", "sha256": "nothex"}}')
    code = (
        "import sys, pathlib;"
        f"sys.path.insert(0, {str(REPO / 'tools')!r});"
        "from forkq import cli, common;"
        f"common.LOCK_FILE = pathlib.Path({str(bad)!r});"
        "sys.exit(cli.main(['version']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "malformed sha256" in proc.stderr and "Traceback" not in proc.stderr


def test_header_validation(tmp_path, upstream_about):
    good = tmp_path / "0001-good.patch"
    good.write_text(format_patch("good", upstream_about, upstream_about + "X = 1\n"))
    assert rules.validate(good) == []
    no_kind = tmp_path / "0002-no-kind.patch"
    no_kind.write_text(good.read_text().replace("Kind: fix\n", ""))
    assert any("'Kind' missing" in p for p in rules.validate(no_kind))
    bad_kind = tmp_path / "0003-bad-kind.patch"
    bad_kind.write_text(good.read_text().replace("Kind: fix", "Kind: wish"))
    assert any("Kind must be" in p for p in rules.validate(bad_kind))


def test_the_repository_series_is_valid():
    """Every patch of the real series has its header, and the kinds come in their order."""
    series = seriesfile.read_series()
    problems = [p for name in series for p in rules.validate(common.PATCH_DIR / name)]
    assert problems == []
    kinds = [patchfile.Patch.read(common.PATCH_DIR / n).kind for n in series]
    assert rules.kind_order_problems(kinds) == []


@pytest.mark.parametrize("kinds, ok", [
    (["compat", "fix", "feature"], True),
    (["compat", "feature"], True),
    (["compat", "fix", "compat", "feature"], True),
    (["compat", "fix", "compat", "fix"], False),
    (["compat", "feature", "fix"], False),
    (["compat", "feature", "compat"], False),
])
def test_kind_order(kinds, ok):
    """Compat patches first, then the upstream fixes in one run, then the compat patches that port the fixes' own
    lines, then the fork's own features."""
    assert (rules.kind_order_problems(kinds) == []) is ok


def test_no_upstream_source_is_tracked():
    tracked = subprocess.run(["git", "ls-files", "src"], cwd=REPO, capture_output=True, text=True).stdout
    assert tracked.strip() == ""


@pytest.fixture
def own_queue(queue, monkeypatch):
    """Point the tool's patch-writing commands at the temporary queue."""
    monkeypatch.setattr(common, "PATCH_DIR", queue / "patches")
    monkeypatch.setattr(common, "SERIES_FILE", queue / "patches" / "series")
    monkeypatch.setattr(common, "LOCK_FILE", queue / "upstream.lock")
    return queue


def test_new_patch_from_edits_in_src(own_queue):
    src = materialize_queue(own_queue)
    about = src / "pytorch_lightning" / "__about__.py"
    about.write_text(about.read_text() + "THIRD = 3\n")
    body = "What was wrong, and why this change fixes it, in enough words\nfor a reviewer."
    path = authoring.new_patch("0003-third.patch", "Add a third constant", body, "fix", "https://example.com/1", "no",
                                "vendor", src=src)
    assert seriesfile.read_series(own_queue / "patches" / "series")[-1] == "0003-third.patch"
    assert rules.validate(path) == []
    patch = patchfile.Patch.read(path)
    assert patch.subject == "Add a third constant" and patch.kind == "fix"
    assert "+THIRD = 3" in patch.diff and "__version__" not in patch.diff
    # src is now recorded as the whole new series, with the new version
    stamp = json.loads((src / tree.STAMP_NAME).read_text())
    assert stamp["patches"][-1] == "0003-third.patch" and stamp["complete"]
    assert stamp["version"] in (src / "pytorch_lightning" / "__version__.py").read_text()
    # and a fresh tree built from the queue is the same
    fresh = tree.materialize(own_queue / "fresh" / "src", lock_file=own_queue / "upstream.lock",
                             patch_dir=own_queue / "patches", quiet=True)
    assert (fresh / "pytorch_lightning" / "__about__.py").read_text() == about.read_text()
    with pytest.raises(common.ForkError, match="no change"):
        authoring.new_patch("0004-nothing.patch", "Nothing", body, "fix", None, "no", "vendor", src=src)


def test_refresh_rewrites_a_patch_in_the_middle_of_the_series(own_queue):
    src = materialize_queue(own_queue, upto="0001-first.patch")
    about = src / "pytorch_lightning" / "__about__.py"
    about.write_text("EARLY = 0\n" + about.read_text())
    before = patchfile.Patch.read(own_queue / "patches" / "0001-first.patch")
    authoring.refresh("0001-first.patch", src=src)
    after = patchfile.Patch.read(own_queue / "patches" / "0001-first.patch")
    assert after.subject == before.subject and after.body == before.body
    assert after.fields == before.fields and "+EARLY = 0" in after.diff
    # the next patch still applies on top of the refreshed one (its context is unchanged)
    full = tree.materialize(own_queue / "full" / "src", lock_file=own_queue / "upstream.lock",
                            patch_dir=own_queue / "patches", quiet=True)
    text = (full / "pytorch_lightning" / "__about__.py").read_text()
    assert text.startswith("EARLY = 0\n") and text.endswith("FIRST = 1\nSECOND = 2\n")
    # the edited tree is what the refreshed patch makes: no longer dirty
    assert tree.local_edits(src) == [] and not tree.tree_version(src).endswith(".dirty")
    # refreshing a patch from a tree that holds another prefix of the series is refused
    with pytest.raises(common.ForkError, match="holds the series up to"):
        authoring.refresh("0002-second.patch", src=src)
