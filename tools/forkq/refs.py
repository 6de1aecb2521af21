"""References to patch files that cannot go stale: every ``NNNN-name.patch`` that the README, the docs, the tests,
the benchmarks or the tools name must be a file of ``patches/1.8.6`` or ``patches/2.6.6``, and so must every
``NNNN-name`` written without ``.patch`` (a number and two or more hyphenated words).

The series is reordered and renumbered, so a doc that names a patch by its number goes stale without anyone
noticing; ``fork.py check`` (``make check-series``) runs this check and says, for each stale reference, the file and
line, and the patch that now carries that name part. Two kinds of names are not the queues' files:

- the copies of an exported series (``build/pr-series/``, ``build/pr-series-2.6.6/``) are numbered anew: after those
  folders, the name part alone must be a patch's;
- the tests of the tools (``tests/tests_fork``) build synthetic queues whose patches have names of their own: there,
  only docstrings and comments are read.

A bare number in prose goes stale the same way, silently: ``fix NNNN``, ``compat patch NNNN``, ``patches NNNN and
NNNN``, ``feature NNNN``, ``see NNNN``, ``before NNNN``, ``up to NNNN``, ``(NNNN)``, ``(NNNN: ...)``, ``(...,
NNNN)``, ``NNNN's`` or a range ``NNNN-NNNN``, for NNNN from 0001 to 0999, is refused in the same files
(``bare_numbers``). Not refused: a file name (``NNNN-name``, checked above), a number in backquotes or after ``=``
(``make fork UPTO=...``), the generated blocks of a page (``<!-- name:begin ... -->`` to ``<!-- name:end -->``,
written by the tools), and the tests of the tools whose docstrings describe synthetic queues or whose code feeds these
checkers numbered names on purpose (``NUMBERED_FIXTURES``).
"""
import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

#: where references are looked for, relative to the checkout
SCANNED = ("README.md", "docs", "tests", "bench", "tools")
#: test modules of the tools, whose code names synthetic patches: only their docstrings and comments count
SYNTHETIC = ("tests/tests_fork/",)
PATCH_FILE = re.compile(r"(?<![\w.])\d{4}-([A-Za-z0-9][A-Za-z0-9_-]*)\.patch\b")
#: a patch file named without its ``.patch`` (`0060-xla-host-copies-off-the-training-thread`): a number, then two
#: or more lower-case words joined by hyphens, so that dates and version strings do not match
PATCH_NAME = re.compile(r"(?<![\w./])0(?!000)\d{3}-[a-z][a-z0-9]*(?:-[a-z0-9]+)+(?![\w-]|\.patch)")
EXPORTED = re.compile(r"build/pr-series(?:-2\.6\.6)?/$")
MAX_BYTES = 1 << 20
#: tests of the tools that number the patches of synthetic queues, or the inputs of these checkers, on purpose
NUMBERED_FIXTURES = ("tests/tests_fork/test_commit_messages.py", "tests/tests_fork/test_patch_headers.py",
                     "tests/tests_fork/test_upstream_test_updates.py")
#: a patch number, 0001 to 0999, that is not part of a file name, a decimal or a longer word
_NUMBER = r"0(?!000)\d{3}(?!\w|\.\d|-[A-Za-z])"
#: a patch named by its bare number in prose; the group that matched holds the number
BARE_NUMBER = re.compile(
    r"\b(?:fix(?:es)?|patch(?:es)?|compat|features?|see|before|after|since|without|up\s+to)"  # fix NNNN, see NNNN
    r"\s+(?P<w>" + _NUMBER + ")"
    r"|(?:\(|;\s+)(?P<p>" + _NUMBER + r")(?=\s*[),:;]|'s\b)"  # (NNNN), (NNNN: ...), (...; NNNN: ...)
    r"|,\s+(?P<l>" + _NUMBER + r")\)"  # (..., NNNN)
    r"|(?<![\w.:+=`-])(?P<s>" + _NUMBER + r")'s\b"  # NNNN's
    r"|(?<![\w.:+=`-])(?P<r>" + _NUMBER + r")-0\d{3}(?![\w.:-])",  # NNNN-NNNN
    re.IGNORECASE)
GENERATED = re.compile(r"<!--\s*([\w-]+):begin\b.*?<!--\s*\1:end\s*-->", re.DOTALL)


def _files(root: Path) -> Iterator[Path]:
    for name in SCANNED:
        top = root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            rel = path.relative_to(root).parts
            if path.is_file() and not any(p.startswith(".") or p == "__pycache__" for p in rel) \
                    and path.stat().st_size <= MAX_BYTES:
                yield path


def _prose_lines(text: str) -> Dict[int, str]:
    """``{line number: text}`` of a Python module's comments and docstrings (its whole text when it does not parse)."""
    lines = text.splitlines()
    try:
        tree = ast.parse(text)
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (SyntaxError, tokenize.TokenError):
        return dict(enumerate(lines, 1))
    found: Dict[int, str] = {}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            for number in range(body[0].lineno, body[0].end_lineno + 1):
                found[number] = lines[number - 1]
    for token in tokens:
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = found.get(token.start[0], "") + " " + token.string
    return found


def _scanned(root: Path) -> Iterator[Tuple[str, Dict[int, str]]]:
    """``(file, {line number: text})`` of every scanned file: the docstrings and comments alone in the tests of the
    tools, every line elsewhere."""
    for path in _files(root):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        rel = path.relative_to(root).as_posix()
        yield rel, _prose_lines(text) if rel.startswith(SYNTHETIC) and path.suffix == ".py" \
            else dict(enumerate(text.splitlines(), 1))


def references(root: Path) -> Iterator[Tuple[str, int, str, bool]]:
    """``(file, line, patch file name, exported copy)`` of every reference under ``root``."""
    for rel, lines in _scanned(root):
        for number, line in sorted(lines.items()):
            for m in PATCH_FILE.finditer(line):
                yield rel, number, m.group(0), bool(EXPORTED.search(line[: m.start()]))
            for m in PATCH_NAME.finditer(line):
                yield rel, number, m.group(0) + ".patch", bool(EXPORTED.search(line[: m.start()]))


def bare_numbers(root: Path) -> Iterator[Tuple[str, int, str]]:
    """``(file, line, number)`` of every patch named by its bare number in the prose under ``root``. The text is read
    whole, so that a word that names a patch may end the line before its number; generated blocks are skipped."""
    for rel, lines in _scanned(root):
        if rel in NUMBERED_FIXTURES or not lines:
            continue
        text = "\n".join(lines.get(number, "") for number in range(1, max(lines) + 1))
        text = GENERATED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in BARE_NUMBER.finditer(text):
            group = next(name for name in "wplsr" if m.group(name))
            yield rel, text.count("\n", 0, m.start(group)) + 1, m.group(group)


def problems(root: Path, patch_dirs: Sequence[Path]) -> List[str]:
    """One message per reference under ``root`` to a patch file that is in none of ``patch_dirs``, and one per patch
    named by its bare number (the first of ``patch_dirs`` says which patch has that number now)."""
    def label(folder: Path) -> str:
        return f"{folder.parent.name}/{folder.name}"  # patches/1.8.6

    existing = {p.name: d for d in patch_dirs for p in sorted(d.glob("*.patch"))}
    by_part: Dict[str, List[str]] = {}
    for name, folder in existing.items():
        by_part.setdefault(PATCH_FILE.fullmatch(name).group(1), []).append(f"{label(folder)}/{name}")
    where = " or ".join(label(d) for d in patch_dirs)
    found = []
    for rel, number, name, exported in references(root):
        part = PATCH_FILE.fullmatch(name).group(1)
        if exported:
            if part not in by_part:
                found.append(f"{rel}:{number}: {name} is an exported copy of no patch of {where} (no patch is named "
                             f"*-{part}.patch)")
            continue
        if name in existing:
            continue
        now = by_part.get(part)
        found.append(f"{rel}:{number}: {name} is no patch of {where}"
                     + (f"; the patch of that name is now {' and '.join(now)}" if now else "")
                     + ". Name a patch by its file name without the number (it changes when the series is renumbered)"
                       " or through a generated block")
    numbered = {p.name[:4]: p.name for p in sorted(patch_dirs[0].glob("*.patch"))} if patch_dirs else {}
    for rel, line, number in bare_numbers(root):
        now = numbered.get(number)
        found.append(f"{rel}:{line}: names patch {number} by its bare number, which changes when the series is "
                     f"renumbered"
                     + (f" ({number} is now {label(patch_dirs[0])}/{now}: check that it is the patch meant)" if now
                        else "")
                     + ": name the patch by its file name without the number, e.g. `xla-bf16-converts-the-module`")
    return found
