"""A small patch queue on the real pinned upstream wheel, for the tests of ``fork.py materialize`` and of what is
built from its tree (``test_fork_tool.py``, ``test_materialize_safety.py``, ``test_install.py``): the fixtures
``upstream_about`` (upstream's ``__about__.py``) and ``queue`` (two patches that each append a line, and the real
lock), ``format_patch`` and ``materialize_queue``. Not a test module: the tests import it, as they import
``synthetic``."""
import difflib
import zipfile
from pathlib import Path

import pytest

from forkq import common, tree, upstream

REPO = Path(__file__).resolve().parents[2]

TARGET = "src/pytorch_lightning/__about__.py"


@pytest.fixture(scope="module")
def upstream_about() -> str:
    lock = upstream.read_lock()
    wheel = upstream.fetch_wheel("pytorch-lightning", lock["pytorch-lightning"])
    with zipfile.ZipFile(wheel) as zf:
        return zf.read("pytorch_lightning/__about__.py").decode()


def format_patch(subject: str, old: str, new: str, path: str = TARGET, kind: str = "fix") -> str:
    """A patch file in the series' format that turns ``old`` into ``new`` at ``path``."""
    diff = "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: Test <test@example.com>\n"
        "Date: Sun, 29 Nov 2026 00:00:00 +0000\n"
        f"Subject: [PATCH] {subject}\n\n"
        "The test needs a body long enough to say what was wrong and why.\n\n"
        "Forwarded: not-needed\nOrigin: vendor\n"
        f"Kind: {kind}\n---\n"
        f"diff --git a/{path} b/{path}\n{diff}"
    )


@pytest.fixture
def queue(tmp_path, upstream_about):
    """A patch dir with two patches that each append a line, and the real lock."""
    patches = tmp_path / "patches"
    patches.mkdir()
    first = upstream_about + "FIRST = 1\n"
    second = first + "SECOND = 2\n"
    (patches / "0001-first.patch").write_text(format_patch("first", upstream_about, first))
    (patches / "0002-second.patch").write_text(format_patch("second", first, second))
    (patches / "series").write_text("# comment\n0001-first.patch\n0002-second.patch\n")
    lock = tmp_path / "upstream.lock"
    lock.write_text(common.LOCK_FILE.read_text())
    return tmp_path


def materialize_queue(queue: Path, **kw) -> Path:
    """``tree.materialize`` of the queue made by the ``queue`` fixture, into its ``src``."""
    return tree.materialize(queue / "src", lock_file=queue / "upstream.lock", patch_dir=queue / "patches",
                            quiet=True, **kw)
