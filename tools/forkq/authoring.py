"""Writing the queue: ``refresh`` (a patch from the edits in ``src/``), ``restat`` (its diffstat), ``new`` (a patch at
the end of the series), ``check`` (both queues), and the README's generated blocks (the version example and the
count of the patches by kind) and docs/patches.md (the table of the patches)."""
import email.utils
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import bench_readme, common, refs
from .blocks import splice
from .common import AUTHOR, KINDS, PACKAGES, ForkError, git
from .patchfile import Patch, merge_diffs, split_diff, upstream_link, with_diff
from .rules import BASES, FIELDS, body_problems, field_problems, queue_problems, value_problem
from .seriescomments import read_series_text, series_text, write_series_comments
from .seriesfile import read_series, resolve_upto
from .tree import (STAMP_NAME, _stamp, build_tree, fork_version, read_stamp, series_digest, write_stamp,
                   write_version)
from .upstream import read_lock


def _copy_tree(src: Path, dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", STAMP_NAME, "*.orig", "*.rej")
    for pkg in PACKAGES:
        shutil.copytree(src / pkg, dest / "src" / pkg, ignore=ignore)


def make_patch(base_names: Sequence[str], src: Path, subject: str, body: str, trailers: Dict[str, str],
               author: str = AUTHOR, date: Optional[str] = None, tests_diff: str = "") -> str:
    """Diff ``src`` against upstream plus ``base_names`` and return it as a format-patch text.

    ``tests_diff`` holds sections that update upstream's own test files (see :func:`split_diff`); they are not in
    ``src``, so they are added to the diff as they are, and the diffstat is redrawn for the whole diff.
    """
    lock = read_lock()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "root"
        build_tree(repo, base_names, lock, common.PATCH_DIR)
        write_version(repo / "src", "1.8.6")
        git(["init", "-q"], cwd=repo)
        git(["add", "-A"], cwd=repo)
        git(["commit", "-q", "-m", "base"], cwd=repo)
        shutil.rmtree(repo / "src")
        _copy_tree(src, repo)
        # the version files are the tool's bookkeeping, never part of a patch
        git(["checkout", "--", *[f"src/{p}/__version__.py" for p in PACKAGES]], cwd=repo)
        git(["add", "-A"], cwd=repo)
        if not git(["diff", "--cached", "--name-only"], cwd=repo).stdout.strip():
            raise ForkError("src/ has no change against the base of this patch; nothing to write")
        # the fields in the order the patch has them (a new patch: the order of FIELDS)
        trailer_text = "\n".join(f"{k}: {v}" for k, v in trailers.items() if v)
        message = f"{subject}\n\n{body.strip()}\n\n{trailer_text}\n"
        env_date = date or email.utils.formatdate(localtime=False)
        name, mail = email.utils.parseaddr(author)
        git(["-c", f"user.name={name}", "-c", f"user.email={mail}", "commit", "-q", "-F", "-",
              f"--author={name} <{mail}>", f"--date={env_date}"], cwd=repo, input=message)
        out = git(["format-patch", "-1", "--stdout", "--no-signature", "--zero-commit", "--full-index"],
                   cwd=repo).stdout
    if tests_diff:
        out = with_diff(out, merge_diffs(Patch(out).diff, tests_diff))
    return out


def _require_src_at(src: Path, names: Sequence[str]) -> None:
    stamp = read_stamp(src)
    if stamp is None:
        raise ForkError(f"{src} was not materialized by this tool; run `make fork` first")
    if stamp["patches"] != list(names):
        raise ForkError(
            f"{src} holds the series up to {stamp['upto']!r}, but this needs it up to {names[-1] if names else None!r}: "
            f"run `make fork UPTO={names[-1] if names else 'upstream'}`, redo your edit, and try again"
        )


def _restamp(src: Path, names: List[str]) -> None:
    """Record that ``src`` holds upstream plus ``names`` (after a patch was written from it), version included."""
    stamp = _stamp(list(names), read_series(), read_lock(), common.PATCH_DIR)
    write_version(src, stamp["version"])
    write_stamp(src, stamp)


def refresh(name: str, src: Optional[Path] = None) -> Path:
    """Rewrite patch ``name`` from the edits in ``src``, which holds the series up to and including it.

    The patch's sections under ``tests/`` (updates to upstream's own tests) are kept unchanged."""
    src = common.ROOT / "src" if src is None else src
    series = read_series()
    upto = resolve_upto(series, name)
    name = upto[-1]
    _require_src_at(src, upto)
    patch = Patch.read(common.PATCH_DIR / name)
    # src/ holds only the packages: the patch's updates to upstream's test files are carried over as they are
    text = make_patch(upto[:-1], src, patch.subject, patch.body, patch.trailers,
                      author=patch.headers.get("From", AUTHOR), date=patch.headers.get("Date"),
                      tests_diff=patch.tests_diff)
    (common.PATCH_DIR / name).write_text(text)
    # src is now "series up to name" again, with the refreshed patch
    _restamp(src, upto)
    print(f"refreshed patches/1.8.6/{name}")
    _sync_repository_readme()
    return common.PATCH_DIR / name


def restat(name: str) -> Path:
    """Redraw the diffstat of patch ``name`` from its diff, after sections were added to it by hand (an update of
    upstream's test files), so that it says what the patch changes. Nothing else of the file changes."""
    path = common.PATCH_DIR / resolve_upto(read_series(), name)[-1]
    text = path.read_text()
    new = with_diff(text, merge_diffs(*split_diff(Patch(text).diff)))
    if new != text:
        path.write_text(new)
        print(f"redrew the diffstat of patches/1.8.6/{path.name}")
        _sync_repository_readme()
    else:
        print(f"patches/1.8.6/{path.name}: the diffstat is current")
    return path


def option_problems(bug: Optional[str], forwarded: str, origin: str, applied_upstream: Optional[str] = None,
                    kind: Optional[str] = None) -> List[str]:
    """What ``fork.py new`` refuses in its options, named by option, each saying what is allowed."""
    options = {"Bug": ("--bug", bug), "Forwarded": ("--forwarded", forwarded), "Origin": ("--origin", origin),
               "Applied-Upstream": ("--applied-upstream", applied_upstream), "Kind": ("--kind", kind)}
    given = [(key, value) for key, (_, value) in options.items() if value]
    problems = [f"{options[key][0]}: {p}" for key, value in given for p in [value_problem(key, value)] if p]
    if not problems:
        # the rules between fields (a backport's Applied-Upstream and Forwarded)
        problems += field_problems(given, required=("Forwarded", "Origin", "Kind"))
    return problems


def new_patch(name: str, subject: str, body: str, kind: str, bug: Optional[str], forwarded: str, origin: str = "vendor",
              src: Optional[Path] = None, applied_upstream: Optional[str] = None) -> Path:
    """Turn the edits in ``src`` (which holds the whole series) into a new patch at the end of the series.

    The options follow the header rules (``rules.field_problems``): ``bug`` is one URL or None, ``forwarded``
    is ``no``, ``not-needed`` or one URL, ``origin`` is ``vendor`` or ``<category>, <URL>``."""
    src = common.ROOT / "src" if src is None else src
    problems = option_problems(bug, forwarded, origin, applied_upstream, kind)
    problems += body_problems(subject, body.strip("\n"), BASES["1.8.6"].body_lines)
    if problems:
        raise ForkError("the new patch's header would break the header rules:\n  " + "\n  ".join(problems))
    series = read_series()
    if not re.fullmatch(r"\d{4}-[a-z0-9-]+\.patch", name):
        raise ForkError("patch names look like NNNN-short-description.patch: four digits, a dash, lowercase words")
    if name in series or (common.PATCH_DIR / name).exists():
        raise ForkError(f"{name} exists already; use refresh")
    _require_src_at(src, series)
    fields = {"Bug": bug, "Forwarded": forwarded, "Applied-Upstream": applied_upstream, "Origin": origin, "Kind": kind}
    text = make_patch(series, src, subject, body, {k: fields[k] for k in FIELDS if fields.get(k)})
    (common.PATCH_DIR / name).write_text(text)
    with open(common.SERIES_FILE, "a") as f:
        f.write(name + "\n")
    write_series_comments(common.PATCH_DIR)
    _restamp(src, series + [name])
    print(f"wrote patches/1.8.6/{name} and added it to the series")
    _sync_repository_readme()
    return common.PATCH_DIR / name


def check(lock_file: Optional[Path] = None, patch_dir: Optional[Path] = None, cache_dir: Optional[Path] = None,
          patch_dir_266: Optional[Path] = None) -> int:
    """Both queues: every patch follows the header rules, the 1.8.6 kinds are in order (compat, fix, feature), the
    series files' comment lines are current, the generated blocks of the README and docs/patches.md are current, no
    doc, test, benchmark or tool names a patch file that does not exist (``refs``), the pages quote benchmark figures
    only of results that measured this series (``bench_readme.stale_blocks``), the whole 1.8.6 series applies
    cleanly, and ``git am``
    takes the 2.6.6 series on the pinned 2.6.6 tree."""
    from .series import pr266

    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    patch_dir_266 = common.PATCH_DIR_266 if patch_dir_266 is None else patch_dir_266
    lock = read_lock(lock_file)
    series = read_series(patch_dir / "series")
    problems = queue_problems("1.8.6", patch_dir) + queue_problems("2.6.6", patch_dir_266)
    readme = common.README
    if patch_dir == common.PATCH_DIR and readme.exists():
        text = readme.read_text()
        for stale in stale_pages(check_only=True):
            problems.append(f"{_names([stale])}: its generated blocks are not current (version {fork_version()}); "
                            "`python3 tools/fork.py readme` writes them")
        if not has_changes_block(text):
            print(f"fork.py: note: {missing_changes_block(readme)}", file=sys.stderr)
    if patch_dir == common.PATCH_DIR:
        # the docs, tests, benchmarks and tools name only patch files that exist
        problems += refs.problems(common.ROOT, [patch_dir, patch_dir_266])
        # the pages quote benchmark figures only of results that measured this series
        if readme.exists() and bench_readme.README.exists():
            problems += bench_readme.stale_blocks(bench_readme.README.read_text(), readme.read_text(),
                                                  series_digest(series, lock, patch_dir))
        # the results that are not current: listed (`make figures` measures them again), not refused
        from . import figures

        for line in figures.report():
            print(f"fork.py: note: {line}", file=sys.stderr)
    # whether the queues apply is reported with the header problems, not instead of them
    applied = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            build_tree(Path(tmp) / "root", series, lock, patch_dir, cache_dir)
        applied.append(f"{len(series)} patches apply cleanly to pytorch-lightning {lock['pytorch-lightning']['version']}")
    except ForkError as err:
        problems.append(str(err))
    names_266 = read_series(patch_dir_266 / "series")
    if names_266:
        try:
            with tempfile.TemporaryDirectory() as tmp:
                tree = pr266.base_tree(Path(tmp) / "lightning", lock_file, cache_dir)
                for name in names_266:
                    pr266.git_am(tree, patch_dir_266 / name)
            applied.append(f"git am takes the {len(names_266)} patches of the 2.6.6 series on lightning 2.6.6")
        except ForkError as err:
            problems.append(str(err))
    for line in applied:
        print(f"series: {line}")
    if problems:
        raise ForkError("series check failed:\n  " + "\n  ".join(problems))
    print("series OK: both queues follow the header rules and apply")
    return 0


def series_comments(write: bool) -> int:
    """Check (or with ``write``, rewrite) the comment lines of both series files from the patch headers."""
    stale = []
    for base in BASES.values():
        if write and write_series_comments(base.patch_dir):
            print(f"wrote the comment lines of {base.patch_dir.relative_to(common.ROOT)}/series")
        elif read_series_text(base.patch_dir) != series_text(base.patch_dir):
            stale.append(f"{base.patch_dir.relative_to(common.ROOT)}/series")
    if stale:
        raise ForkError(f"the comment lines of {', '.join(stale)} are not those of the patch headers; "
                        "`python3 tools/fork.py series-comments --write` writes them")
    if not write:
        print("the series files' comment lines are current")
    return 0


# --------------------------------------------------------------------------------------------- README
README_BEGIN = "<!-- version:begin"
README_END = "<!-- version:end -->"
CHANGES_BEGIN = ("<!-- changes:begin: written by `python3 tools/fork.py readme`, checked by "
                 "tests/tests_fork/test_install.py -->")
CHANGES_END = "<!-- changes:end -->"
#: the page that lists every patch of the 1.8.6 series (the README holds its counts by kind and a link to it)
PATCHES_BEGIN = ("<!-- patches:begin: written by `python3 tools/fork.py readme`, checked by "
                 "tests/tests_fork/test_install.py -->")
PATCHES_END = "<!-- patches:end -->"


def patches_page() -> Path:
    return common.ROOT / "docs" / "patches.md"


def readme_version_block(version: str) -> str:
    """The README's example of the installed version, for ``version``."""
    return (
        "```bash\n"
        "$ pip show pytorch-lightning | head -2\n"
        "Name: pytorch-lightning\n"
        f"Version: {version}\n"
        '$ python -c "import pytorch_lightning; print(pytorch_lightning.__version__)"\n'
        f"{version}\n"
        "```\n"
    )


def readme_with_version(text: str, version: str) -> str:
    """``text`` (the README) with its version block rewritten for ``version``."""
    new = splice(text, README_BEGIN, README_END, readme_version_block(version))
    if new is None:
        raise ForkError(f"the README has no version block ({README_BEGIN} ... --> then {README_END})")
    return new


def _link(url: Optional[str]) -> str:
    if not url:
        return "-"
    m = re.fullmatch(r"https://github\.com/([^/]+/[^/]+)/(?:issues|pull)/(\d+)", url)
    return f"[{m.group(1)}#{m.group(2)}]({url})" if m else f"<{url}>"


def patches_table_block(patch_dir: Optional[Path] = None) -> str:
    """docs/patches.md's table of what the fork changes: one row per patch of the 1.8.6 series, in order."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    rows = ["| # | kind | change | upstream |", "|---|---|---|---|"]
    for name in read_series(patch_dir / "series"):
        patch = Patch.read(patch_dir / name)
        subject = patch.subject.replace("|", "\\|")
        rows.append(f"| {name.split('-', 1)[0]} | {patch.kind or '?'} | {subject} | "
                    f"{_link(upstream_link(patch.trailers))} |")
    return "\n".join(rows) + "\n"


def readme_changes_block(patch_dir: Optional[Path] = None) -> str:
    """The README's count of the patches by kind, with the link to docs/patches.md."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    kinds = [Patch.read(patch_dir / name).kind for name in read_series(patch_dir / "series")]
    counts = ", ".join(f"{kinds.count(kind)} {kind}" for kind in KINDS)
    return (f"The series holds {len(kinds)} patches: {counts}.\n"
            "[docs/patches.md](docs/patches.md) lists them in order, one row each, with the upstream issue it "
            "answers.\n")


def has_changes_block(text: str) -> bool:
    return splice(text, CHANGES_BEGIN, CHANGES_END, "") is not None


def missing_changes_block(readme: Path) -> str:
    return (f"{readme.name} has no count of the changes yet: add the line `{CHANGES_BEGIN}` and, below it, the line "
            f"`{CHANGES_END}` where it goes, then run `python3 tools/fork.py readme`")


def readme_with_changes(text: str, patch_dir: Optional[Path] = None) -> Optional[str]:
    """``text`` with its count of the changes rewritten; None when it has no such block."""
    return splice(text, CHANGES_BEGIN, CHANGES_END, readme_changes_block(patch_dir))


def page_with_patches(text: str, patch_dir: Optional[Path] = None) -> str:
    """``text`` (docs/patches.md) with its table of the patches rewritten."""
    new = splice(text, PATCHES_BEGIN, PATCHES_END, patches_table_block(patch_dir))
    if new is None:
        raise ForkError(f"docs/patches.md has no table of the patches: add the line `{PATCHES_BEGIN}` and, below it, "
                        f"the line `{PATCHES_END}`, then run `python3 tools/fork.py readme`")
    return new


def stale_pages(readme: Optional[Path] = None, version: Optional[str] = None, page: Optional[Path] = None,
                check_only: bool = False) -> List[Path]:
    """Make the generated blocks current: the README's version example (``fork.py version``) and, when it has its
    markers, its count of the changes; docs/patches.md's table of the patches. Returns the pages that were not
    current; with ``check_only`` nothing is written."""
    readme = common.README if readme is None else readme
    page = patches_page() if page is None else page
    version = fork_version() if version is None else version
    stale = []
    text = readme.read_text()
    wanted = readme_with_version(text, version)
    wanted = readme_with_changes(wanted) or wanted
    if wanted != text:
        stale.append(readme)
        if not check_only:
            readme.write_text(wanted)
    if page.exists() or not check_only:
        text = page.read_text() if page.exists() else ""
        wanted = page_with_patches(text)
        if wanted != text:
            stale.append(page)
            if not check_only:
                page.write_text(wanted)
    else:
        stale.append(page)
    return stale


def sync_readme(readme: Optional[Path] = None, version: Optional[str] = None, check_only: bool = False,
                page: Optional[Path] = None) -> bool:
    """True when the generated blocks of the README and docs/patches.md were current (:func:`stale_pages`)."""
    return not stale_pages(readme, version, page, check_only)


def _names(pages: Sequence[Path]) -> str:
    return " and ".join(p.relative_to(common.ROOT).as_posix() if p.is_relative_to(common.ROOT) else p.name
                        for p in pages)


def readme(check_only: bool) -> int:
    """Write (or with ``check_only``, check) the generated blocks of the README and docs/patches.md."""
    path = common.README
    stale = stale_pages(check_only=check_only)
    if stale and check_only:
        raise ForkError(f"the generated blocks of {_names(stale)} are stale; `python3 tools/fork.py readme` writes "
                        f"them (version {fork_version()})")
    print(f"{path.name}: the version example is {fork_version()}" if not stale
          else f"generated blocks updated in {_names(stale)} (version {fork_version()})")
    if not has_changes_block(path.read_text()):
        raise ForkError(missing_changes_block(path))
    return 0


def _sync_repository_readme() -> None:
    """After a patch of this repository's series changed: its version changed, and so does the README example."""
    if common.PATCH_DIR.resolve() == (common.ROOT / "patches" / "1.8.6").resolve() and common.README.exists():
        stale = stale_pages()
        if stale:
            print(f"updated the generated blocks of {_names(stale)} ({fork_version()})")
