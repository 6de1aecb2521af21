"""One patch file, read: the ``Patch`` object (the one reader of a patch's header: subject, body, fields, kind, the
upstream link), its diff taken apart (touched files, the sections that update upstream's ``tests/``, diffstats, the
tests a pull request adds) and the one reader of its CHANGELOG lines. Standard library and git only."""
import re
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .common import UPSTREAM_TESTS, ForkError, git

#: a URL as a field holds it: https, nothing after it
URL = r"https://[^\s()<>]+"


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


def file_sections(diff: str) -> List["tuple[str, str]"]:
    """``[(path, section)]`` of a diff, in its order: each file's section with the path it leaves (``b/``)."""
    return [(_section_paths(section)[1], section) for section in _diff_sections(diff)]


def _is_test_section(section: str) -> bool:
    return any(p.startswith(UPSTREAM_TESTS) for p in _section_paths(section))


def split_diff(diff: str) -> "tuple[str, str]":
    """``(src part, tests part)`` of a patch's diff.

    A patch that changes behaviour on purpose updates upstream's tests of that behaviour in the same patch: its
    sections whose path starts with ``tests/`` are diffs against the files of upstream's tag ``1.8.6``
    (``tests/tests_pytorch/...``, ``tests/tests_lite/...``; their context lines are the tag's lines). Materialize
    skips them (the wheel has no tests), ``refresh`` carries them over unchanged, the PR series exports them, and
    ``fork.py upstream-tests`` applies them to upstream's tests before it runs them.
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


def numstat(diff: str) -> List["tuple[int, int, str]"]:
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
        rows = numstat(diff)
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


def upstream_link(fields: Dict[str, str]) -> Optional[str]:
    """The upstream URL a patch's header names: its Bug, else the URL of its Applied-Upstream."""
    if re.fullmatch(URL, fields.get("Bug", "")):
        return fields["Bug"]
    m = re.fullmatch(rf"\S+, ({URL})", fields.get("Applied-Upstream", ""))
    return m.group(1) if m else None
