"""The header rules of a patch (DEP-3 fields, a short body, one-line CHANGELOG entries), the series files' comment
lines, the README's table of the changes, and the one reader of FIXED_BY: small fixture patches, each rule shown
rejecting a bad value with a message that says what to write instead, and well-formed headers passing."""
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from forkq import authoring, common, fixedby, rules, seriescomments, seriesfile

REPO = Path(__file__).resolve().parents[2]
BUG = "https://github.com/Lightning-AI/lightning/issues/15884"
PR = "https://github.com/Lightning-AI/lightning/pull/16020"
BODY = ("The XLA step was not cut after the optimizer step, so the next\n"
        "batch joined its graph and every step compiled again.\n"
        "\n"
        "Measured: one graph per step instead of two (XLA:CPU).")
CHANGELOG_ENTRY = f"- Fixed the XLA step not being cut after the optimizer step ([#15884]({BUG}))"
FIELDS = f"Bug: {BUG}\nForwarded: no\nOrigin: vendor\nKind: fix\n"


def _diff(entry: str = CHANGELOG_ENTRY, heading: str = "### Fixed") -> str:
    return (
        "diff --git a/src/pytorch_lightning/CHANGELOG.md b/src/pytorch_lightning/CHANGELOG.md\n"
        "index 0000000..1111111 100644\n"
        "--- a/src/pytorch_lightning/CHANGELOG.md\n"
        "+++ b/src/pytorch_lightning/CHANGELOG.md\n"
        "@@ -1,2 +1,3 @@\n"
        f" {heading}\n"
        f"+{entry}\n"
        " \n"
        "diff --git a/src/pytorch_lightning/x.py b/src/pytorch_lightning/x.py\n"
        "index 0000000..1111111 100644\n"
        "--- a/src/pytorch_lightning/x.py\n"
        "+++ b/src/pytorch_lightning/x.py\n"
        "@@ -1 +1 @@\n"
        "-A = 1\n"
        "+A = 2\n"
    )


def _patch(fields: str = FIELDS, body: str = BODY, subject: str = "Cut the XLA step after the optimizer step",
           diff: Optional[str] = None, blank_before_fields: bool = True) -> str:
    return (
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        "From: Lightning XLA fork <lightning-xla-fork@users.noreply.github.com>\n"
        "Date: Sun, 29 Nov 2026 00:00:00 +0000\n"
        f"Subject: [PATCH] {subject}\n"
        "\n"
        f"{body}\n"
        + ("\n" if blank_before_fields else "")
        + f"{fields}"
        "---\n"
        " src/pytorch_lightning/CHANGELOG.md | 1 +\n"
        " src/pytorch_lightning/x.py         | 2 +-\n"
        " 2 files changed, 2 insertions(+), 1 deletion(-)\n"
        "\n"
        + (_diff() if diff is None else diff)
    )


def _problems(tmp_path: Path, text: str, base: str = "1.8.6") -> list:
    path = tmp_path / "0001-a.patch"
    path.write_text(text)
    return [p.split(": ", 1)[1] for p in rules.validate(path, base)]


def _one(tmp_path: Path, text: str, base: str = "1.8.6") -> str:
    problems = _problems(tmp_path, text, base)
    assert len(problems) == 1, problems
    return problems[0]


# --------------------------------------------------------------------------------------------- good headers
@pytest.mark.parametrize("fields", [
    FIELDS,
    "Forwarded: not-needed\nOrigin: vendor\nKind: compat\n",  # no upstream issue: no Bug line at all
    f"Bug: {BUG}\nForwarded: {PR}\nOrigin: vendor\nKind: fix\n",  # forwarded as a pull request
    f"Bug: {BUG}\nForwarded: not-needed\nApplied-Upstream: 1.9.0, {PR}\nOrigin: backport, {PR}\nKind: fix\n",
    f"Bug: {BUG}\nForwarded: no\nOrigin: upstream, {PR}\nKind: fix\n",
    f"Bug: {BUG}\nForwarded: no\nOrigin: other, https://github.com/pytorch/xla/pull/1\nKind: fix\n",
])
def test_well_formed_headers_pass(tmp_path, fields):
    assert _problems(tmp_path, _patch(fields=fields)) == []


def test_a_long_url_alone_on_its_line_is_allowed(tmp_path):
    body = BODY + "\nSee:\n" + "https://github.com/pytorch/xla/blob/master/docs/" + "a" * 60 + ".md"
    assert _problems(tmp_path, _patch(body=body)) == []


# --------------------------------------------------------------------------------------------- the fields
@pytest.mark.parametrize("value", ["none", "none (environment compatibility)", f"{BUG} (also #15885)",
                                   f"{BUG} {PR}", "http://github.com/Lightning-AI/lightning/issues/1", "#15884"])
def test_bug_is_one_url_or_absent(tmp_path, value):
    message = _one(tmp_path, _patch(fields=FIELDS.replace(BUG, value),
                                    diff=_diff("- Fixed the XLA step not being cut after the optimizer step")))
    assert message.startswith(f"Bug: {value!r} is not one https:// URL")
    assert "drop the Bug line" in message


@pytest.mark.parametrize("value", ["yes", "no (1.8.x gets no further upstream release)", "not-needed (upstream has both)",
                                   f"no, {PR}", f"{PR} (merged)", "No"])
def test_forwarded_is_no_not_needed_or_one_url(tmp_path, value):
    message = _one(tmp_path, _patch(fields=FIELDS.replace("Forwarded: no", f"Forwarded: {value}")))
    assert message.startswith(f"Forwarded: {value!r} is not allowed")
    assert "exactly `no`, `not-needed`, or one https:// URL" in message


@pytest.mark.parametrize("value", ["vendor, Lightning XLA fork", f"backport, {PR} (the Trainer's barrier, 1.9.0)",
                                   f"upstream {PR}", "upstream", f"fork, {PR}", f"vendor, {PR}"])
def test_origin_is_vendor_or_a_category_and_a_url(tmp_path, value):
    message = _one(tmp_path, _patch(fields=FIELDS.replace("Origin: vendor", f"Origin: {value}")))
    assert message.startswith(f"Origin: {value!r} is not allowed")
    assert "exactly `vendor`" in message and "upstream, backport, other" in message


@pytest.mark.parametrize("value", ["1.9.0", PR, f"1.9.0, {PR} (the Trainer only)", f"v1.9.0, {PR}"])
def test_applied_upstream_is_a_version_and_a_url(tmp_path, value):
    fields = f"Bug: {BUG}\nForwarded: not-needed\nApplied-Upstream: {value}\nOrigin: backport, {PR}\nKind: fix\n"
    message = _one(tmp_path, _patch(fields=fields))
    assert message.startswith(f"Applied-Upstream: {value!r} is not `<version>, <URL>`")


def test_a_backport_needs_applied_upstream_and_forwarded_not_needed(tmp_path):
    problems = _problems(tmp_path, _patch(fields=f"Bug: {BUG}\nForwarded: no\nOrigin: backport, {PR}\nKind: fix\n"))
    assert problems == ["a backport (Origin: backport, ...) needs `Applied-Upstream: <version>, <URL>`",
                        "a backport has `Forwarded: not-needed`, not 'no'"]


def test_applied_upstream_only_on_a_backport(tmp_path):
    fields = f"Bug: {BUG}\nForwarded: not-needed\nApplied-Upstream: 1.9.0, {PR}\nOrigin: vendor\nKind: fix\n"
    assert _one(tmp_path, _patch(fields=fields)) == (
        "Applied-Upstream is only for a backport: with it, write `Origin: backport, <URL>`")


def test_kind_is_compat_fix_or_feature_and_required_in_the_1_8_6_queue(tmp_path):
    assert _one(tmp_path, _patch(fields=FIELDS.replace("Kind: fix", "Kind: wish"))) == (
        "Kind must be one of ('compat', 'fix', 'feature'), not 'wish'")
    assert _one(tmp_path, _patch(fields=FIELDS.replace("Kind: fix\n", ""))) == "field 'Kind' missing"


@pytest.mark.parametrize("missing", ["Forwarded", "Origin"])
def test_forwarded_and_origin_are_required(tmp_path, missing):
    fields = "".join(line + "\n" for line in FIELDS.splitlines() if not line.startswith(missing))
    assert _one(tmp_path, _patch(fields=fields)) == f"field {missing!r} missing"


def test_no_other_fields_and_none_twice(tmp_path):
    problems = _problems(tmp_path, _patch(fields=FIELDS + "Last-Update: 2026-11-29\nKind: fix\n"))
    assert problems == ["field 'Kind' appears 2 times; write it once",
                        "field 'Last-Update' is not one of the fork's fields (Bug, Forwarded, Applied-Upstream, "
                        "Origin, Kind); move what it says into the body"]


def test_the_fields_follow_a_blank_line(tmp_path):
    body = BODY.replace("Measured: one graph", "It now makes one graph")
    assert _one(tmp_path, _patch(body=body, blank_before_fields=False)) == (
        "a blank line must separate the body from the fields")


# --------------------------------------------------------------------------------------------- the body
def test_the_body_has_at_most_15_lines_of_72_characters(tmp_path):
    long_body = "\n".join(f"Line {i} of a body that says too much." for i in range(16))
    assert _one(tmp_path, _patch(body=long_body)) == (
        "the body has 16 lines; at most 15 (why, in a few lines, and the measured effect in one)")
    wide = BODY + "\n" + "x" * 73
    assert _one(tmp_path, _patch(body=wide)) == "body line 5 has 73 characters; at most 72"


def test_a_pull_request_for_2_6_6_may_have_25_lines(tmp_path):
    body = "\n".join(f"Line {i} of the description of a pull request, long enough." for i in range(25))
    problems = _problems(tmp_path, _patch(body=body, fields="Forwarded: no\nOrigin: vendor\n"), base="2.6.6")
    assert not [p for p in problems if "lines; at most" in p or "field" in p]
    problems = _problems(tmp_path, _patch(body=body + "\nOne more.", fields="Forwarded: no\nOrigin: vendor\n"),
                         base="2.6.6")
    assert "the body has 26 lines; at most 25 (why, in a few lines, and the measured effect in one)" in problems


@pytest.mark.parametrize("text, found", [
    ("It builds on the previous patch.", "the previous patch"),
    ("The next patch moves it.", "The next patch"),
    ("As the patch before it does.", "the patch before"),
    ("This reverts part of patch 0012.", "patch 0012"),
    ("Requested in issue 19 of the fork.", "issue 19 of the fork"),
])
def test_no_positional_references(tmp_path, text, found):
    assert _one(tmp_path, _patch(body=BODY + "\n" + text)) == (
        f"{found!r} points at a place in the series; name the behaviour instead")


# --------------------------------------------------------------------------------------------- CHANGELOG lines
def test_a_changelog_entry_is_one_line_of_at_most_160_characters(tmp_path):
    entry = "- Fixed " + "a very long description " * 7 + f"([#15884]({BUG}))"
    assert _one(tmp_path, _patch(diff=_diff(entry))).startswith(f"CHANGELOG entry `{entry[:50]}...` has ")
    two_lines = _diff(CHANGELOG_ENTRY + "\n+  which continues on a second line")
    assert "an entry is one line that starts with `- Fixed `" in _one(tmp_path, _patch(diff=two_lines))


def test_a_changelog_entry_stands_under_its_heading(tmp_path):
    assert _one(tmp_path, _patch(diff=_diff(heading="### Added"))) == (
        "CHANGELOG entry `- Fixed ...` stands under `### Added`; put it under `### Fixed`")


def test_a_changelog_entry_links_the_lightning_issue_of_the_bug_field(tmp_path):
    entry = "- Fixed the XLA step not being cut after the optimizer step"
    assert _one(tmp_path, _patch(diff=_diff(entry))) == (
        f"CHANGELOG entry `{entry[:50]}...` must end with `([#15884]({BUG}))` (the Bug URL)")
    # a Bug elsewhere than Lightning's tracker asks for no link
    fields = FIELDS.replace(BUG, "https://github.com/pytorch/xla/issues/4174")
    assert _problems(tmp_path, _patch(fields=fields, diff=_diff(entry))) == []


# --------------------------------------------------------------------------------------------- fork.py new
def test_new_accepts_only_valid_options_and_says_what_is_allowed():
    assert authoring.option_problems(BUG, "no", "vendor", kind="fix") == []
    assert authoring.option_problems(None, "not-needed", f"backport, {PR}", f"1.9.0, {PR}", kind="fix") == []
    problems = authoring.option_problems("none", "yes", "vendor, Lightning XLA fork", kind="fix")
    assert [p.split(":", 1)[0] for p in problems] == ["--bug", "--forwarded", "--origin"]
    assert "exactly `no`, `not-needed`, or one https:// URL" in problems[1]
    assert authoring.option_problems(None, "no", f"backport, {PR}", kind="fix") == [
        "a backport (Origin: backport, ...) needs `Applied-Upstream: <version>, <URL>`",
        "a backport has `Forwarded: not-needed`, not 'no'"]


def test_new_on_the_command_line_refuses_a_bad_forwarded_before_it_builds_anything(tmp_path):
    body = tmp_path / "body"
    body.write_text(BODY)
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "fork.py"), "new", "0099-x.patch", "--subject", "X",
                           "--body-file", str(body), "--kind", "fix", "--forwarded", "no (later)"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--forwarded: Forwarded: 'no (later)' is not allowed" in proc.stderr
    assert not (common.PATCH_DIR / "0099-x.patch").exists()


# --------------------------------------------------------------------------------------------- series comments
def _queue(tmp_path: Path) -> Path:
    queue = tmp_path / "queue"
    queue.mkdir()
    (queue / "0001-a.patch").write_text(_patch())
    fields = f"Bug: {BUG}\nForwarded: not-needed\nApplied-Upstream: 1.9.0, {PR}\nOrigin: backport, {PR}\nKind: fix\n"
    (queue / "0002-b.patch").write_text(_patch(fields=fields.replace(f"Bug: {BUG}\n", ""), subject="Backport B",
                                                diff=_diff("- Fixed B")))
    (queue / "series").write_text("# The introduction stays.\n\n0001-a.patch\n# a stale comment\n0002-b.patch\n")
    return queue


def test_the_series_comment_lines_are_written_from_the_headers_and_checked(tmp_path):
    queue = _queue(tmp_path)
    problems = rules.queue_problems("1.8.6", queue)
    assert problems == ["queue/series: its comment lines are not those of the patch headers; "
                        "`python3 tools/fork.py series-comments --write` writes them"]
    assert seriescomments.write_series_comments(queue)
    assert (queue / "series").read_text() == (
        "# The introduction stays.\n\n"
        f"# [fix] Cut the XLA step after the optimizer step <{BUG}>\n0001-a.patch\n"
        f"# [fix] Backport B <{PR}>\n0002-b.patch\n")
    assert rules.queue_problems("1.8.6", queue) == []
    assert not seriescomments.write_series_comments(queue)
    # a changed subject makes its comment stale again
    text = (queue / "0002-b.patch").read_text()
    (queue / "0002-b.patch").write_text(text.replace("Subject: [PATCH] Backport B", "Subject: [PATCH] Backport C"))
    assert rules.queue_problems("1.8.6", queue) != []
    assert seriesfile.read_series(queue / "series") == ["0001-a.patch", "0002-b.patch"]


def test_the_repository_series_files_have_current_comment_lines():
    for base in rules.BASES.values():
        assert seriescomments.read_series_text(base.patch_dir) == seriescomments.series_text(base.patch_dir), (
            f"{base.patch_dir}/series: run `python3 tools/fork.py series-comments --write`")


def test_both_queues_live_under_one_root_and_the_2_6_6_patches_have_no_gaps():
    assert common.PATCH_DIR == REPO / "patches" / "1.8.6" and common.PATCH_DIR_266 == REPO / "patches" / "2.6.6"
    names = seriesfile.read_series(common.PATCH_DIR_266 / "series")
    assert [n.split("-", 1)[0] for n in names] == [f"{i:04d}" for i in range(1, len(names) + 1)]
    assert sorted(p.name for p in common.PATCH_DIR_266.glob("*.patch")) == names


# --------------------------------------------------------------------------------------------- README, docs/patches.md
def test_the_table_of_patches_has_a_row_per_patch_and_the_readme_counts_them(tmp_path):
    queue = _queue(tmp_path)
    table = authoring.patches_table_block(queue)
    assert table.splitlines() == [
        "| # | kind | change | upstream |", "|---|---|---|---|",
        f"| 0001 | fix | Cut the XLA step after the optimizer step | [Lightning-AI/lightning#15884]({BUG}) |",
        f"| 0002 | fix | Backport B | [Lightning-AI/lightning#16020]({PR}) |"]
    page = f"# P\n\n{authoring.PATCHES_BEGIN}\nold\n{authoring.PATCHES_END}\n\nafter\n"
    assert authoring.page_with_patches(page, queue) == (
        f"# P\n\n{authoring.PATCHES_BEGIN}\n{table}{authoring.PATCHES_END}\n\nafter\n")
    with pytest.raises(common.ForkError, match="docs/patches.md has no table of the patches"):
        authoring.page_with_patches("# no block\n", queue)
    counts = authoring.readme_changes_block(queue)
    assert counts.splitlines()[0] == "The series holds 2 patches: 0 compat, 2 fix, 0 feature."
    assert "[docs/patches.md](docs/patches.md)" in counts
    readme = f"# R\n\n{authoring.CHANGES_BEGIN}\nold\n{authoring.CHANGES_END}\n\nafter\n"
    assert authoring.readme_with_changes(readme, queue) == (
        f"# R\n\n{authoring.CHANGES_BEGIN}\n{counts}{authoring.CHANGES_END}\n\nafter\n")
    assert authoring.readme_with_changes("# no block\n", queue) is None


def test_a_stale_table_of_patches_is_named_by_check_and_rewritten_by_readme(tmp_path):
    page = tmp_path / "patches.md"
    current = authoring.patches_page().read_text()
    page.write_text(current.replace("| 0001 | compat |", "| 0001 | fix |"))
    readme = tmp_path / "README.md"
    readme.write_text(common.README.read_text())
    assert authoring.stale_pages(readme, page=page, check_only=True) == [page]
    assert "| 0001 | fix |" in page.read_text()  # a check writes nothing
    assert authoring.stale_pages(readme, page=page) == [page]
    assert page.read_text() == current and authoring.stale_pages(readme, page=page, check_only=True) == []


def test_readme_says_clearly_when_the_readme_has_no_table_yet(tmp_path, monkeypatch, capsys):
    from forkq import cli

    readme = tmp_path / "README.md"
    text = (REPO / "README.md").read_text()
    begin = text.find(authoring.CHANGES_BEGIN)
    if begin >= 0:
        text = text[:begin] + text[text.index(authoring.CHANGES_END) + len(authoring.CHANGES_END):]
    readme.write_text(text)
    monkeypatch.setattr(common, "README", readme)
    assert cli.main(["readme"]) == 1
    err = capsys.readouterr().err
    assert "README.md has no count of the changes yet: add the line `<!-- changes:begin" in err
    assert "`<!-- changes:end -->`" in err


# --------------------------------------------------------------------------------------------- FIXED_BY
def test_fixed_by_is_read_from_the_module_level_assignment_only(tmp_path):
    root = tmp_path / "tests"
    (root / "tests_pytorch").mkdir(parents=True)
    (root / "tests_lite").mkdir()
    (root / "tests_pytorch" / "test_a.py").write_text('"""Doc."""\n\nFIXED_BY = "0005-a.patch"  # proves it\n\n\n'
                                                       "def test_a():\n    pass\n")
    # a test that writes such a module in a string declares nothing itself
    (root / "tests_lite" / "test_b.py").write_text('TEXT = """\nFIXED_BY = "0006-b.patch"\n"""\n')
    (root / "tests_lite" / "helper.py").write_text('FIXED_BY = "0007-c.patch"\n')
    assert fixedby.fixed_by_map(root) == {"0005-a.patch": [root / "tests_pytorch" / "test_a.py"],
                                            "0007-c.patch": [root / "tests_lite" / "helper.py"]}
    assert fixedby.drop_fixed_by((root / "tests_pytorch" / "test_a.py").read_text()) == (
        '"""Doc."""\n\n\ndef test_a():\n    pass\n')
