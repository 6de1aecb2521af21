"""One patch file of a queue: parse it, validate its header against the fork's DEP-3 rules, read its diff (touched
files, ``tests/`` sections, diffstat, CHANGELOG lines); the series files and their comment lines; and the one reader
of ``FIXED_BY`` (the constant a test module declares to name the patch it proves). Standard library and git only."""
import ast
import re
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import common
from .common import KINDS, UPSTREAM_TESTS, ForkError, git

# --------------------------------------------------------------------------------------------- series files
def read_series(series_file: Optional[Path] = None) -> List[str]:
    """The patch names of the series, in order; blank lines and ``#`` comments are ignored."""
    series_file = common.SERIES_FILE if series_file is None else series_file
    if not series_file.exists():
        return []
    names = []
    for line in series_file.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    if len(set(names)) != len(names):
        raise ForkError(f"{series_file} names a patch twice")
    for name in names:
        if not (series_file.parent / name).is_file():
            raise ForkError(f"{series_file} names {name!r}, but {series_file.parent / name} does not exist")
    return names


def resolve_upto(series: Sequence[str], upto: Optional[str]) -> List[str]:
    """The prefix of ``series`` that ends with ``upto`` (a file name, or its number prefix such as ``0003``)."""
    if upto is None:
        return list(series)
    if upto in ("", "0", "none", "upstream"):
        return []
    name = common.match_patch(series, upto)
    if name is None:
        raise ForkError(f"--upto {upto!r} matches no single patch of the series; the series is: {', '.join(series)}")
    return list(series[: list(series).index(name) + 1])


# --------------------------------------------------------------------------------------------- parsing
class Patch:
    """One patch file, parsed once: the one reader of a patch's header.

    ``headers`` are the mail headers (``From_`` is the ``From <sha> ...`` line), ``subject`` the Subject without its
    ``[PATCH]`` tag, ``body`` the message without the fields, ``fields`` the ``Key: value`` lines that end it, in
    file order (``trailers`` as a dict), ``kind`` its ``Kind:`` field (None without one), ``diff`` everything from
    the first ``diff --git`` on (the diffstat left out). Raises ForkError when the text has no diff.
    """

    def __init__(self, text: str, path: Optional[Path] = None) -> None:
        self.text, self.path = text, path
        self.name = path.name if path is not None else ""
        m = re.search(r"^---\n|^diff --git ", text, flags=re.M)
        if not m:
            raise ForkError("no diff found")
        head, diff = text[: m.start()], text[m.start():]
        if diff.startswith("---\n"):
            # skip the diffstat
            d = re.search(r"^diff --git ", diff, flags=re.M)
            diff = diff[d.start():] if d else ""
        self.diff = diff
        self.headers: Dict[str, str] = {}
        lines = head.splitlines()
        i = 0
        if lines and lines[0].startswith("From "):
            self.headers["From_"] = lines[0]
            i = 1
        while i < len(lines) and lines[i].strip():
            key, _, value = lines[i].partition(":")
            i += 1
            while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
                value += " " + lines[i].strip()
                i += 1
            self.headers[key.strip()] = value.strip()
        message = "\n".join(lines[i:]).strip("\n")
        self.fields: List[Tuple[str, str]] = []
        body_lines = message.splitlines()
        while body_lines and re.match(r"^[A-Z][A-Za-z-]*: ", body_lines[-1]):
            key, _, value = body_lines.pop().partition(": ")
            self.fields.insert(0, (key, value.strip()))
        self.subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", self.headers.get("Subject", ""))
        # the fields stand after a blank line; without one, the last paragraph would be read as fields
        self.fields_separated = not self.fields or not body_lines or not body_lines[-1].strip()
        self.body = "\n".join(body_lines).strip("\n")

    @classmethod
    def read(cls, path: Path) -> "Patch":
        return cls(path.read_text(), path)

    @property
    def trailers(self) -> Dict[str, str]:
        return dict(self.fields)

    @property
    def kind(self) -> Optional[str]:
        """``compat``, ``fix`` or ``feature`` (the ``Kind:`` field); None when the patch has none."""
        return self.trailers.get("Kind")

    @property
    def files(self) -> List[str]:
        return touched_files(self.diff)

    @property
    def tests_diff(self) -> str:
        """The sections that update upstream's own tests (see :func:`split_diff`)."""
        return split_diff(self.diff)[1]

    @property
    def changelog(self) -> List[str]:
        """The lines the patch adds to CHANGELOG.md files, headings included."""
        return [line for _, line in changelog_entries(self.diff)]


def touched_files(diff: str, tree: Optional[str] = None) -> List[str]:
    """The paths a diff changes, old and new names, in order of appearance.

    ``tree="src"`` keeps the paths of the generated packages (what materialize applies), ``tree="tests"`` those of
    upstream's own test files (what a patch updates in upstream's ``tests/``), ``None`` every path.
    """
    seen: List[str] = []
    for a, b in re.findall(r"^diff --git a/(\S+) b/(\S+)$", diff, flags=re.M):
        for path in (a, b):
            if path in seen:
                continue
            if tree == "tests" and not path.startswith(UPSTREAM_TESTS):
                continue
            if tree == "src" and path.startswith(UPSTREAM_TESTS):
                continue
            seen.append(path)
    return seen


def _diff_sections(diff: str) -> List[str]:
    """The per-file sections of a diff (each starts with ``diff --git``); text before the first is dropped."""
    starts = [m.start() for m in re.finditer(r"^diff --git ", diff, flags=re.M)]
    return [diff[a:b] for a, b in zip(starts, starts[1:] + [len(diff)])]


def _section_paths(section: str) -> "tuple[str, str]":
    m = re.match(r"diff --git a/(\S+) b/(\S+)$", section, flags=re.M)
    if not m:
        raise ForkError(f"malformed diff section: {section.splitlines()[0]!r}")
    return m.group(1), m.group(2)


def _is_test_section(section: str) -> bool:
    return any(p.startswith(UPSTREAM_TESTS) for p in _section_paths(section))


def split_diff(diff: str) -> "tuple[str, str]":
    """``(src part, tests part)`` of a patch's diff.

    A patch that changes behaviour on purpose updates upstream's tests of that behaviour in the same patch: its
    sections whose path starts with ``tests/`` are diffs against the files of upstream's tag ``1.8.6``
    (``tests/tests_pytorch/...``, ``tests/tests_lite/...``; their context lines are the tag's lines). Materialize
    skips them (the wheel has no tests), ``refresh`` carries them over unchanged, the PR series exports them, and
    ``tools/upstream_tests.py`` applies them to upstream's tests before it runs them.
    """
    src, tests = [], []
    for section in _diff_sections(diff):
        (tests if _is_test_section(section) else src).append(section)
    return "".join(src), "".join(tests)


def merge_diffs(first: str, second: str) -> str:
    """The sections of two diffs of different files, in git's order (by path)."""
    sections = _diff_sections(first) + _diff_sections(second)
    paths = [_section_paths(s)[1] for s in sections]
    if len(set(paths)) != len(paths):
        raise ForkError(f"two diffs change the same file: {sorted(p for p in paths if paths.count(p) > 1)}")
    sections = [s if s.endswith("\n") else s + "\n" for s in sections]
    return "".join(s for _, s in sorted(zip(paths, sections), key=lambda pair: pair[0]))


def _numstat(diff: str) -> List["tuple[int, int, str]"]:
    """``[(added, deleted, path)]`` of a diff, read by ``git apply --numstat`` (nothing is applied)."""
    with tempfile.TemporaryDirectory() as tmp:
        patch = Path(tmp) / "diff.patch"
        patch.write_text(diff)
        out = git(["apply", "--numstat", "-z", str(patch)], cwd=Path(tmp)).stdout
    rows = []
    for record in out.split("\0"):
        if record.strip():
            added, deleted, path = record.split("\t", 2)
            rows.append((int(added), int(deleted), path))
    return rows


def diffstat(diff: str) -> str:
    """The diffstat ``git format-patch`` writes for ``diff`` (paths, bars, summary and the create/delete lines).

    git draws it from the paths and line counts alone, so it is drawn by ``git format-patch`` itself, from a
    throw-away commit whose files have the same paths and counts: a patch whose sections were put together
    (:func:`merge_diffs`) gets the stat git would have written for the whole diff.
    """
    created = {_section_paths(s)[1] for s in _diff_sections(diff) if re.search(r"^new file mode ", s, flags=re.M)}
    deleted = {_section_paths(s)[0] for s in _diff_sections(diff) if re.search(r"^deleted file mode ", s, flags=re.M)}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "stat"
        repo.mkdir()
        git(["init", "-q"], cwd=repo)
        rows = _numstat(diff)
        for added, removed, path in rows:
            if path in created:
                continue
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text("".join(f"old {i}\n" for i in range(removed)) or "")
        git(["add", "-A"], cwd=repo)
        git(["commit", "-q", "--allow-empty", "-m", "before"], cwd=repo)
        for added, removed, path in rows:
            if path in deleted:
                (repo / path).unlink()
                continue
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            (repo / path).write_text("".join(f"new {i}\n" for i in range(added)))
        git(["add", "-A"], cwd=repo)
        git(["commit", "-q", "--allow-empty", "-m", "after"], cwd=repo)
        out = git(["format-patch", "-1", "--stdout", "--no-signature"], cwd=repo).stdout
    return re.search(r"^---\n(.*?\n)\n(?=diff --git )", out, flags=re.M | re.S).group(1)


def with_diff(patch_text: str, diff: str) -> str:
    """``patch_text`` (a format-patch file) with its diff replaced by ``diff`` and the diffstat redrawn for it."""
    m = re.search(r"^---\n", patch_text, flags=re.M)
    d = re.search(r"^diff --git ", patch_text, flags=re.M)
    if not m or not d or d.start() < m.start():
        raise ForkError("the patch has no `---` line and diffstat before its diff")
    return patch_text[: m.end()] + diffstat(diff) + "\n" + diff


def added_tests(patch_text: str, roots: Sequence[str] = ("tests/tests_fabric/", "tests/tests_pytorch/")) -> List[str]:
    """pytest node ids (``tests/.../test_x.py::test_name``) of the test functions and classes the diff adds under
    ``roots`` (the 2.6.6 series' pull requests carry their tests)."""
    nodes: List[str] = []
    for chunk in _diff_sections(patch_text):
        path = _section_paths(chunk)[1]
        if not path.startswith(tuple(roots)) or not Path(path).name.startswith("test_") or not path.endswith(".py"):
            continue
        for name in re.findall(r"^\+(?:async )?def (test_\w+)\(|^\+class (Test\w+)\b", chunk, flags=re.M):
            node = f"{path}::{name[0] or name[1]}"
            if node not in nodes:
                nodes.append(node)
    return nodes


# --------------------------------------------------------------------------------------------- the header rules
#: the fields a patch may carry, in the order they are written (DEP-3, plus the fork's own ``Kind``)
FIELDS = ("Bug", "Forwarded", "Applied-Upstream", "Origin", "Kind")
FORWARDED = ("no", "not-needed")
ORIGIN_CATEGORIES = ("upstream", "backport", "other")
URL = r"https://[^\s()<>]+"
CHANGELOG_VERBS = ("Added", "Changed", "Deprecated", "Removed", "Fixed")
CHANGELOG_MAX = 160
BODY_WIDTH = 72


class Base:
    """What differs between the two queues: where they live, which fields a patch must carry, how long its body
    may be, and the rules of a pull request against Lightning 2.6.6."""

    def __init__(self, name: str, required: Sequence[str], body_lines: int, pull_requests: bool) -> None:
        self.name, self.required, self.body_lines, self.pull_requests = name, tuple(required), body_lines, pull_requests

    @property
    def patch_dir(self) -> Path:
        return common.PATCH_DIR if self.name == "1.8.6" else common.PATCH_DIR_266


BASES = {
    "1.8.6": Base("1.8.6", ("Forwarded", "Origin", "Kind"), 15, pull_requests=False),
    # a pull request's description may keep the small table of what it measured
    "2.6.6": Base("2.6.6", ("Forwarded", "Origin"), 25, pull_requests=True),
}
PR_TEST_ROOTS = ("tests/tests_fabric/", "tests/tests_pytorch/")

# positional references: a patch names the behaviour it builds on, never its place in a series
POSITIONAL = re.compile(
    r"\b(?:the )?(?:previous|next|preceding|following) patch(?:es)?\b"
    r"|\bthe patch(?:es)? (?:before|after)\b"
    r"|\bpatch(?:es)? \d{4}\b"
    r"|\bissue \d+ of the fork\b|\bthe fork's issue \d+\b",
    re.I,
)


def value_problem(key: str, value: str) -> Optional[str]:
    """What is wrong with the value of one field, saying what is allowed; None when it is well-formed."""
    if key == "Bug" and not re.fullmatch(URL, value):
        return (f"Bug: {value!r} is not one https:// URL. Bug holds exactly one URL with nothing after it; without an "
                "upstream issue, drop the Bug line (explanations go into the body)")
    if key == "Forwarded" and value not in FORWARDED and not re.fullmatch(URL, value):
        return (f"Forwarded: {value!r} is not allowed. Write exactly `no`, `not-needed`, or one https:// URL (of the "
                "upstream pull request), with nothing after it; reasons go into the body")
    if key == "Origin" and value != "vendor" and not re.fullmatch(rf"(?:{'|'.join(ORIGIN_CATEGORIES)}), {URL}", value):
        return (f"Origin: {value!r} is not allowed. Write exactly `vendor` for a patch written by the fork (the From: "
                f"line stands for it), or `<category>, <URL>` with category {', '.join(ORIGIN_CATEGORIES)} and the "
                "URL of the upstream commit or pull request, nothing after it")
    if key == "Applied-Upstream" and not re.fullmatch(rf"\d+(?:\.\d+)+, {URL}", value):
        return (f"Applied-Upstream: {value!r} is not `<version>, <URL>` (e.g. `1.9.0, "
                "https://github.com/Lightning-AI/lightning/pull/16020`), nothing after the URL")
    if key == "Kind" and value not in KINDS:
        return f"Kind must be one of {KINDS}, not {value!r}"
    return None


def field_problems(fields: Sequence[Tuple[str, str]], required: Sequence[str] = ("Forwarded", "Origin", "Kind")
                   ) -> List[str]:
    """What breaks the header rules in ``fields`` (``[(key, value)]`` in file order); each message says what is
    allowed."""
    problems: List[str] = []
    keys = [k for k, _ in fields]
    for key in sorted({k for k in keys if keys.count(k) > 1}, key=keys.index):
        problems.append(f"field {key!r} appears {keys.count(key)} times; write it once")
    for key in keys:
        if key not in FIELDS:
            problems.append(f"field {key!r} is not one of the fork's fields ({', '.join(FIELDS)}); "
                            "move what it says into the body")
    for key in required:
        if key not in keys:
            problems.append(f"field {key!r} missing")
    value = dict(fields)
    problems += [p for p in (value_problem(k, v) for k, v in value.items() if k in FIELDS) if p]
    # the rules between fields: a backport says where upstream applied it, and needs no forwarding
    forwarded, applied, origin = value.get("Forwarded"), value.get("Applied-Upstream"), value.get("Origin", "")
    # (judged only on a well-formed Origin: a malformed one is reported above, once)
    if origin.startswith("backport, ") and value_problem("Origin", origin) is None:
        if applied is None:
            problems.append("a backport (Origin: backport, ...) needs `Applied-Upstream: <version>, <URL>`")
        if forwarded is not None and forwarded != "not-needed":
            problems.append(f"a backport has `Forwarded: not-needed`, not {forwarded!r}")
    elif applied is not None and origin and value_problem("Origin", origin) is None:
        problems.append("Applied-Upstream is only for a backport: with it, write `Origin: backport, <URL>`")
    return problems


def body_problems(subject: str, body: str, max_lines: int = 15) -> List[str]:
    """The body says why in a few short lines and names behaviours, never places in a series."""
    problems = []
    lines = body.splitlines()
    if len(body.strip()) < 40:
        problems.append("the body must say what was wrong and why this fix")
    if len(lines) > max_lines:
        problems.append(f"the body has {len(lines)} lines; at most {max_lines} (why, in a few lines, and the measured "
                        "effect in one)")
    for number, line in enumerate(lines, 1):
        # a URL cannot be wrapped: a line holding only one may be longer
        if len(line) > BODY_WIDTH and not re.fullmatch(rf"\s*(?:[-*] )?<?{URL}>?[.,;)]*", line):
            problems.append(f"body line {number} has {len(line)} characters; at most {BODY_WIDTH}")
    for text in (subject, body):
        for m in POSITIONAL.finditer(text):
            problems.append(f"{m.group(0)!r} points at a place in the series; name the behaviour instead")
    return problems


def changelog_entries(diff: str) -> List[Tuple[Optional[str], str]]:
    """``[(heading, line)]`` of the lines a diff adds to CHANGELOG.md files, in order (blank lines and the ``-``
    placeholder of an empty list left out; an added heading line is one too). The heading is the ``### ...`` line
    above the line in its hunk, when the hunk shows one. The one reader of a patch's CHANGELOG lines."""
    entries: List[Tuple[Optional[str], str]] = []
    in_changelog, heading = False, None
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            in_changelog, heading = line.endswith("CHANGELOG.md"), None
            continue
        if not in_changelog or line.startswith(("+++", "---")):
            continue
        if line.startswith("@@"):
            heading = None
            continue
        if line[:1] in (" ", "+") and line[1:].startswith("### "):
            heading = line[5:].strip()
        if line.startswith("+") and line[1:].strip() not in ("", "-"):
            entries.append((heading, line[1:]))
    return entries


def changelog_problems(diff: str, bug: Optional[str]) -> List[str]:
    """Each CHANGELOG entry is one line in upstream's form, under its heading, linked to the Lightning issue."""
    problems = []
    link = None
    m = re.fullmatch(r"https://github\.com/Lightning-AI/lightning/(?:issues|pull)/(\d+)", bug or "")
    if m:
        link = f" ([#{m.group(1)}]({bug}))"
    for heading, line in changelog_entries(diff):
        if line.startswith("#"):
            continue  # a heading, or the release line above it
        verb = re.match(rf"- ({'|'.join(CHANGELOG_VERBS)}) ", line)
        if not verb:
            problems.append(f"CHANGELOG line {line[:60]!r}...: an entry is one line that starts with "
                            f"`- Fixed `, `- Added `, `- Changed ` (or `- Deprecated `, `- Removed `)")
            continue
        if heading is not None and heading != verb.group(1):
            problems.append(f"CHANGELOG entry `- {verb.group(1)} ...` stands under `### {heading}`; "
                            f"put it under `### {verb.group(1)}`")
        if len(line) > CHANGELOG_MAX:
            problems.append(f"CHANGELOG entry `{line[:50]}...` has {len(line)} characters; at most {CHANGELOG_MAX}")
        if link and not line.endswith(link):
            problems.append(f"CHANGELOG entry `{line[:50]}...` must end with `{link.strip()}` (the Bug URL)")
    return problems


def pull_request_problems(patch: Patch) -> List[str]:
    """What keeps a 2.6.6 patch from being one pull request against upstream's source layout."""
    problems = []
    if not patch.text.startswith("From 0000000000000000000000000000000000000000 "):
        problems.append("not a `git format-patch --zero-commit` mbox (first line)")
    author = patch.headers.get("From")
    if author and author != common.AUTHOR:
        problems.append(f"author {author!r}, the series uses {common.AUTHOR!r}")
    if len(patch.body.strip()) < 200:
        problems.append("the message must be the PR description (what was wrong, the fix, the tests)")
    files = patch.files
    outside = [f for f in files if not f.startswith(("src/lightning/",) + PR_TEST_ROOTS)]
    if outside:
        problems.append(f"touches paths outside upstream's src/lightning/ and tests/: {outside}")
    if not added_tests(patch.text, PR_TEST_ROOTS):
        problems.append(f"adds no test under {' or '.join(PR_TEST_ROOTS)}")
    if files and not any(f.endswith("CHANGELOG.md") for f in files):
        problems.append("no CHANGELOG entry")
    return problems


def validate(path: Path, base: str = "1.8.6") -> List[str]:
    """Problems with one patch of the ``base`` queue (``1.8.6`` or ``2.6.6``), each prefixed with the file name;
    empty when the patch follows every rule."""
    rules = BASES[base]
    try:
        patch = Patch.read(path)
    except ForkError as err:
        return [f"{path.name}: {err}"]
    text, headers = patch.text, patch.headers
    problems = []
    if "From_" in headers and not re.fullmatch(r"From [0-9a-f]{40} Mon Sep 17 00:00:00 2001", headers["From_"]):
        problems.append("the first line must be git format-patch's `From <sha> Mon Sep 17 00:00:00 2001`")
    for key in ("From_", "From", "Date", "Subject"):
        if key not in headers:
            problems.append(f"header {key.rstrip('_')!r} missing")
    if "Subject" in headers and not headers["Subject"].startswith("[PATCH"):
        problems.append("the Subject must start with `[PATCH]` (git format-patch writes it)")
    if not patch.subject:
        problems.append("empty subject")
    if not re.search(r"^---$", text.split("\ndiff --git ", 1)[0], flags=re.M):
        problems.append("no `---` line (then the diffstat) between the message and the diff")
    if not patch.fields_separated:
        problems.append("a blank line must separate the body from the fields")
    problems += field_problems(patch.fields, rules.required)
    problems += body_problems(patch.subject, patch.body, rules.body_lines)
    if not patch.diff:
        problems.append("no diff")
    else:
        problems += changelog_problems(patch.diff, patch.trailers.get("Bug"))
    if rules.pull_requests:
        problems += pull_request_problems(patch)
    else:
        tests_diff = patch.tests_diff if patch.diff else ""
        if tests_diff:
            try:
                _numstat(tests_diff)
            except ForkError as err:
                problems.append(f"its sections under {UPSTREAM_TESTS} (updates of upstream's tests) are not a "
                                f"valid diff: {err}")
    return [f"{path.name}: {p}" for p in problems]


def kind_order_problems(kinds: Sequence[Optional[str]]) -> List[str]:
    """The series holds the compat patches that port upstream first, then the fixes, then the compat patches that
    must follow them (they port lines the fixes add, e.g. to today's torch_xla API), then the features.

    The fixes stay one contiguous run, so that they apply to upstream on their own (``make pr-series``).
    """
    shape = "".join({"compat": "c", "fix": "x", "feature": "f"}[k] for k in kinds if k in KINDS)
    if re.fullmatch(r"c*x*c*f*", shape):
        return []
    return ["the series must hold the compat patches first, then the fix patches, then the compat patches that port"
            " the fixes' own lines, then the feature patches"]


def queue_problems(base: str = "1.8.6", patch_dir: Optional[Path] = None) -> List[str]:
    """Every patch of a queue follows the header rules, every ``*.patch`` is listed, the kinds are in their order,
    and the series file's comment lines are the ones ``series-comments --write`` writes."""
    patch_dir = BASES[base].patch_dir if patch_dir is None else patch_dir
    series = read_series(patch_dir / "series")
    problems = [p for name in series for p in validate(patch_dir / name, base)]
    listed = set(series)
    for stray in sorted(patch_dir.glob("*.patch")):
        if stray.name not in listed:
            problems.append(f"{stray.name}: in {patch_dir.name}/ but not in its series")
    kinds = [Patch.read(patch_dir / n).kind for n in series]
    problems += kind_order_problems(kinds)
    if read_series_text(patch_dir) != series_text(patch_dir):
        problems.append(f"{patch_dir.name}/series: its comment lines are not those of the patch headers; "
                        "`python3 tools/fork.py series-comments --write` writes them")
    return problems


# --------------------------------------------------------------------------------------------- series comments
def upstream_link(fields: Dict[str, str]) -> Optional[str]:
    """The upstream URL a patch's header names: its Bug, else the URL of its Applied-Upstream."""
    if re.fullmatch(URL, fields.get("Bug", "")):
        return fields["Bug"]
    m = re.fullmatch(rf"\S+, ({URL})", fields.get("Applied-Upstream", ""))
    return m.group(1) if m else None


def series_comment(path: Path) -> str:
    """The comment line above a patch in its series: kind, subject, upstream link (when the header has one)."""
    patch = Patch.read(path)
    link = upstream_link(patch.trailers)
    return "# " + (f"[{patch.kind}] " if patch.kind else "") + patch.subject + (f" <{link}>" if link else "")


def read_series_text(patch_dir: Path) -> str:
    path = patch_dir / "series"
    return path.read_text() if path.exists() else ""


def series_text(patch_dir: Path) -> str:
    """The series file as ``series-comments --write`` writes it: its introduction (the leading comment lines up to
    the first blank line) as it is, then each patch's name under its comment line."""
    current = read_series_text(patch_dir)
    lines = current.splitlines()
    intro: List[str] = []
    if "" in lines and all(line.startswith("#") for line in lines[: lines.index("")]):
        intro = lines[: lines.index("")] + [""]
    out = intro + [line for name in read_series(patch_dir / "series")
                   for line in (series_comment(patch_dir / name), name)]
    return "\n".join(out) + "\n"


def write_series_comments(patch_dir: Path) -> bool:
    """Rewrite the comment lines of ``patch_dir/series`` from the headers; True when the file changed."""
    wanted = series_text(patch_dir)
    if wanted == read_series_text(patch_dir):
        return False
    (patch_dir / "series").write_text(wanted)
    return True


# --------------------------------------------------------------------------------------------- FIXED_BY
def fixed_by(path: Path) -> Optional[str]:
    """The patch a test module proves: the value of its module-level ``FIXED_BY = "<patch>"``, or None. Only a
    module-level assignment counts, not the text of a test that writes such a module."""
    text = path.read_text()
    if "FIXED_BY" not in text:
        return None
    node = _fixed_by_node(text, path)
    return None if node is None else str(node.value.value)


def _fixed_by_node(text: str, path: Optional[Path] = None) -> Optional[ast.Assign]:
    try:
        tree = ast.parse(text)
    except SyntaxError as err:
        raise ForkError(f"{path or 'a test module'} is not valid Python, so its FIXED_BY cannot be read: {err}")
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "FIXED_BY" and isinstance(node.value, ast.Constant)):
            return node
    return None


def fixed_by_map(tests_root: Path, roots: Sequence[str] = ("tests_pytorch", "tests_lite")) -> Dict[str, List[Path]]:
    """``{patch name: [test modules declaring FIXED_BY = that patch]}`` under ``tests_root/<root>`` for each root."""
    found: Dict[str, List[Path]] = {}
    for root in roots:
        for path in sorted((tests_root / root).rglob("*.py")):
            name = fixed_by(path)
            if name is not None:
                found.setdefault(name, []).append(path)
    return found


def drop_fixed_by(text: str) -> str:
    """``text`` without its FIXED_BY assignment; when it stood between blank lines, one of them goes with it."""
    node = _fixed_by_node(text)
    if node is None:
        return text
    lines = text.splitlines(keepends=True)
    first, last = node.lineno - 1, node.end_lineno
    after_blank = last < len(lines) and not lines[last].strip()
    before_blank = first > 0 and not lines[first - 1].strip()
    del lines[first: last + (1 if after_blank and before_blank else 0)]
    return "".join(lines)
