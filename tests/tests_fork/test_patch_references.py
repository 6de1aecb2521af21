"""References to patch files cannot go stale: every ``NNNN-name.patch`` that the README, the docs, the tests, the
benchmarks or the tools name is a file of ``patches/1.8.6`` or ``patches/2.6.6``, and ``make check-series``
(``fork.py check``) fails on one that is not, naming the file and line and the patch that now has that name. It also
fails on a patch named by its bare number in prose, which goes stale as silently when the series is renumbered."""

from forkq import cli, common, refs, seriesfile

DIRS = [common.PATCH_DIR, common.PATCH_DIR_266]


def _renumbered(name: str) -> str:
    """``name`` under a number no patch of the series has."""
    return "9999-" + name.split("-", 1)[1]


def test_the_checkout_names_only_patches_that_exist():
    assert refs.problems(common.ROOT, DIRS) == []


def test_a_stale_reference_planted_in_a_doc_makes_check_series_fail(tmp_path, monkeypatch, capsys):
    real = seriesfile.read_series()[-1]
    stale = _renumbered(real)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(f"# A page\n\nThe feature is `{real}`.\nIt was `{stale}`.\n")
    monkeypatch.setattr(common, "ROOT", tmp_path)
    assert cli.main(["check"]) == 1
    err = capsys.readouterr().err
    assert f"docs/page.md:4: {stale} is no patch of patches/1.8.6 or patches/2.6.6" in err
    assert f"the patch of that name is now patches/1.8.6/{real}" in err
    assert "docs/page.md:3" not in err


def test_what_counts_as_a_reference(tmp_path):
    patches = tmp_path / "patches" / "1.8.6"
    patches.mkdir(parents=True)
    (patches / "0001-real-thing.patch").write_text("")
    (tmp_path / "README.md").write_text("`0001-real-thing.patch`, `0002-gone.patch`\n")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "x.py").write_text('KNOWN = {"0003-real-thing.patch": "a renumbered key"}\n')
    # the exported series numbers its copies anew: there the name part must be a patch's
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "prs.md").write_text("`build/pr-series/0007-real-thing.patch` and "
                                               "`build/pr-series-2.6.6/0001-unknown.patch`\n")
    # the tests of the tools build synthetic queues: only their docstrings and comments are references
    (tmp_path / "tests" / "tests_fork").mkdir(parents=True)
    (tmp_path / "tests" / "tests_fork" / "test_q.py").write_text(
        '"""Checks the queue of `0004-old-name.patch`."""\n'
        'NAME = "0005-synthetic.patch"  # a queue of its own, unlike 0006-real-thing.patch\n\n\n'
        'def test_x():\n    """Not 0008-docstring.patch."""\n    assert NAME != "0009-data.patch"\n')
    found = refs.problems(tmp_path, [patches])
    assert [f.split(" is ", 1)[0] for f in found] == [
        "README.md:1: 0002-gone.patch",
        "docs/prs.md:1: 0001-unknown.patch",
        "tests/tests_fork/test_q.py:1: 0004-old-name.patch",
        "tests/tests_fork/test_q.py:2: 0006-real-thing.patch",
        "tests/tests_fork/test_q.py:6: 0008-docstring.patch",
        "tools/x.py:1: 0003-real-thing.patch",
    ]
    assert "is an exported copy of no patch of patches/1.8.6 (no patch is named *-unknown.patch)" in found[1]
    assert found[-1].startswith("tools/x.py:1: 0003-real-thing.patch is no patch of patches/1.8.6; the patch of that "
                                "name is now patches/1.8.6/0001-real-thing.patch. Name a patch by its file name without the number")


def test_a_numbered_name_without_its_suffix_is_a_reference_too(tmp_path):
    """Docs often write `0060-xla-host-copies-off-the-training-thread`, without ``.patch``: that goes stale the same
    way. Dates, versions and single words after a number are not patch names."""
    patches = tmp_path / "patches" / "1.8.6"
    patches.mkdir(parents=True)
    (patches / "0001-real-thing.patch").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "`0001-real-thing` holds; `0002-real-thing` was renumbered; 0003-gone-now is no patch.\n"
        "Not names: 2026-12-02, 1.8.6+xla.61.g91f5, 0004-alone, `0001-real-thing.patch`.\n")
    found = refs.problems(tmp_path, [patches])
    assert [f.split(" is ", 1)[0] for f in found] == ["docs/page.md:1: 0002-real-thing.patch",
                                                      "docs/page.md:1: 0003-gone-now.patch"]
    assert "the patch of that name is now patches/1.8.6/0001-real-thing.patch" in found[0]


def test_a_bare_patch_number_planted_in_a_doc_makes_check_series_fail(tmp_path, monkeypatch, capsys):
    real = seriesfile.read_series()[0]
    number, name = real[:4], real[5:-len(".patch")]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(f"# A page\n\nThe dtype comes from fix {number}.\nIt is `{name}`.\n")
    monkeypatch.setattr(common, "ROOT", tmp_path)
    assert cli.main(["check"]) == 1
    err = capsys.readouterr().err
    assert f"docs/page.md:3: names patch {number} by its bare number" in err
    assert f"({number} is now patches/1.8.6/{real}: check that it is the patch meant)" in err
    assert "name the patch by its file name without the number, e.g. `xla-bf16-converts-the-module`" in err
    assert "docs/page.md:4" not in err
    # named by its file name without the number, the same page passes
    (tmp_path / "docs" / "page.md").write_text(f"# A page\n\nThe dtype comes from fix `{name}`.\nIt is `{name}`.\n")
    assert refs.problems(tmp_path, DIRS) == []


def test_what_counts_as_a_bare_patch_number(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "fix 0013, Fix 0012 and compat patch 0040; see the patches 0002 and\n"
        "0003, the fixes 0006-0011, the feature 0045 (0061) (0023: the accuracy; 0022: the order)\n"
        "(averaged, 0021), 0014's base class, 1.8.6 before 0007, the series up to 0006\n"
        "<!-- table:begin -->\n| 0001 | compat | up to 0004 (0005) |\n<!-- table:end -->\n")
    (tmp_path / "docs" / "b.md").write_text(
        "`0013-xla-bf16-converts-the-module.patch`, `0013-xla-bf16-converts-the-module`, `make fork UPTO=0004`,\n"
        "`make restat PATCH=0013`, a number (`0057`), 0.0025 with 2 replicas, +0000, 2026-11-29, fix 1234, fix 0000,\n"
        "port 8080, (1013), patch 00131, 10013-0011\n")
    (tmp_path / "tests" / "tests_fork").mkdir(parents=True)
    # in the tests of the tools only docstrings and comments count, and the checkers' fixtures not at all
    (tmp_path / "tests" / "tests_fork" / "test_q.py").write_text(
        '"""A queue: fix 0002."""\nNAME = "fix 0003"  # the fix 0004\n')
    (tmp_path / "tests" / "tests_fork" / "test_commit_messages.py").write_text('"""From 0055 to 0057: fix 0057."""\n')
    assert sorted(refs.bare_numbers(tmp_path)) == [
        ("docs/a.md", 1, "0002"), ("docs/a.md", 1, "0012"), ("docs/a.md", 1, "0013"), ("docs/a.md", 1, "0040"),
        ("docs/a.md", 2, "0006"), ("docs/a.md", 2, "0022"), ("docs/a.md", 2, "0023"), ("docs/a.md", 2, "0045"),
        ("docs/a.md", 2, "0061"),
        ("docs/a.md", 3, "0006"), ("docs/a.md", 3, "0007"), ("docs/a.md", 3, "0014"), ("docs/a.md", 3, "0021"),
        ("tests/tests_fork/test_q.py", 1, "0002"), ("tests/tests_fork/test_q.py", 2, "0004"),
    ]
