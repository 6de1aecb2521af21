"""The fork's test modules that prove a fix, as upstream's: each module that declares ``FIXED_BY = "<fix>"`` moves to
the same path in upstream's tree (``tests/tests_pytorch/X.py`` -> ``tests/tests_pytorch/X.py``), its local helper
imports rewritten to upstream's (``from helpers.runif import RunIf`` -> ``from tests_pytorch.helpers.runif import
RunIf``), the fork's helper modules it needs beside it, the ``FIXED_BY`` constant and the fork's markers removed.
Also: the upstream tests a fix updates (its ``tests/`` sections)."""
import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ... import common
from ...fixedby import drop_fixed_by, fixed_by_map
from ...patchfile import touched_files

TEST_ROOTS = ("tests_pytorch", "tests_lite")
# fork-only names that upstream's 1.8.6 test suite does not have; reported in the PR description
FORK_ONLY = {
    "min_torch_xla": "`RunIf(min_torch_xla=...)` is the fork's; upstream's RunIf has no such argument",
}


def fix_tests(tests_root: Path) -> Dict[str, List[Path]]:
    """``{patch name: [test modules declaring FIXED_BY = that patch]}`` under tests_pytorch/ and tests_lite/."""
    return fixed_by_map(tests_root, TEST_ROOTS)


GUARD_DECORATOR_RE = re.compile(r"^([ \t]*)@pytest\.mark\.(?:guard|slow)\b[ \t]*(#[^\n]*)?\n", re.M)
GUARD_PARAM_RE = re.compile(r",\s*marks=pytest\.mark\.guard\b")
XLA_METRICS_FIXTURE = (
    "\n\n@pytest.fixture\n"
    "def xla_metrics():\n"
    '    """Reset ``torch_xla.debug.metrics`` and return a reader of the counters that a step costs."""\n'
    "    return XLACounters.cleared()\n"
)


def _drop_guards(text: str) -> str:
    """``@pytest.mark.guard`` is the fork's bookkeeping for ``fork.py before-after`` (a test that already passed before
    the fix) and ``@pytest.mark.slow`` its scheduling hint; upstream's configuration (``--strict-markers``) knows
    neither. The decorator goes, its
    comment stays as a plain comment."""
    text = GUARD_DECORATOR_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}\n" if m.group(2) else "", text)
    return GUARD_PARAM_RE.sub("", text)


FORK_SERVER_ARG_RE = re.compile(r",\s*fork_server=fork_server\b")
FORK_SERVER_PARAM_RE = re.compile(r"^(\s*def test\w*\([^)]*?)(?:,\s*fork_server\b|\bfork_server,\s*)", re.M)


def _drop_fork_server(text: str) -> str:
    """The fork's ``fork_server`` fixture (its ``tests/conftest.py``) only saves the imports of the processes a test
    starts; upstream's suite has no such fixture, so an exported test starts fresh interpreters as it would without
    it: the parameter and the ``fork_server=fork_server`` arguments go."""
    return FORK_SERVER_ARG_RE.sub("", FORK_SERVER_PARAM_RE.sub(r"\1", text))


def _uses_fixture(text: str, name: str) -> bool:
    return re.search(rf"^\s*def test\w*\([^)]*\b{name}\b", text, flags=re.M) is not None


def _add_xla_metrics_fixture(text: str, root: str) -> str:
    """The fork's ``xla_metrics`` fixture lives in its ``tests/conftest.py``; an exported module gets its own, on top
    of the exported helper, so that it needs nothing from upstream's conftest."""
    if not _uses_fixture(text, "xla_metrics") or re.search(r"^def xla_metrics\(", text, flags=re.M):
        return text
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    first_def = min((d.decorator_list[0].lineno if d.decorator_list else d.lineno) for d in defs) - 1
    needs_pytest = not any(isinstance(n, ast.Import) and any(a.name == "pytest" for a in n.names) for n in imports)
    # the fixture goes after the module's last statement before its first function or class (its constants), so
    # that comments and decorators stay with what they belong to
    before = max(n.end_lineno for n in tree.body if n.lineno - 1 < first_def)
    added = f"from {root}.helpers.xla_metrics import XLACounters\n"
    if needs_pytest:
        added = "import pytest\n" + added
    head = "".join(lines[: imports[-1].end_lineno]) + added + "".join(lines[imports[-1].end_lineno: before])
    return head.rstrip("\n") + XLA_METRICS_FIXTURE + "\n\n" + "".join(lines[before:]).lstrip("\n")


def export_test(path: Path, tests_root: Path) -> Tuple[str, str, List[str]]:
    """(upstream path, upstream content, warnings) for one of our fix test modules."""
    rel = path.relative_to(tests_root)
    root = rel.parts[0]
    text = path.read_text()
    text = drop_fixed_by(text)
    text = _drop_guards(text)
    text = _add_xla_metrics_fixture(text, root)
    text = _drop_fork_server(text)
    text = re.sub(r"^(\s*)from helpers(\.| import)", rf"\1from {root}.helpers\2", text, flags=re.M)
    text = re.sub(r"^(\s*)import helpers\.", rf"\1import {root}.helpers.", text, flags=re.M)
    # the fork's RunIf(xla=True) runs on an XLA device of any kind; upstream's 1.8.6 equivalent is tpu=True
    text = re.sub(r"(RunIf\([^)]*?)\bxla=True", r"\1tpu=True", text)
    text = re.sub(r"RunIf\(tpu=True, tpu=True", "RunIf(tpu=True", text)
    warnings = [f"{rel}: {why}" for word, why in FORK_ONLY.items() if re.search(rf"\b{word}\b", text)]
    if re.search(r"\bFIXED_BY\b", text):
        warnings.append(f"{rel}: still mentions FIXED_BY")
    if re.search(r"\bfork_server\b", text):
        warnings.append(f"{rel}: still uses the fork's fork_server fixture")
    if re.search(r"mark\.guard\b", text):
        warnings.append(f"{rel}: still uses the fork's guard marker")
    return f"tests/{rel.as_posix()}", text, warnings


UPSTREAM_HELPERS = {"runif"}


def _helper_names(text: str) -> List[str]:
    """The ``helpers`` modules ``text`` imports: ``from helpers.X import ...``, ``import helpers.X`` and
    ``from helpers import X, Y as Z``."""
    names = re.findall(r"^\s*from helpers\.(\w+) import", text, flags=re.M)
    names += re.findall(r"^\s*import helpers\.(\w+)", text, flags=re.M)
    for group in re.findall(r"^\s*from helpers import \(?([\w ,\n]+?)\)?$", text, flags=re.M):
        names += [part.split(" as ")[0].strip() for part in group.split(",") if part.strip()]
    return names


def fork_helpers(test: Path, tests_root: Path) -> List[Path]:
    """The fork's ``tests/helpers/*.py`` modules that ``test`` needs (directly, through another helper, or for the
    ``xla_metrics`` fixture) and upstream does not have, dependencies first."""
    found: List[str] = []

    def visit(text: str) -> None:
        for name in _helper_names(text):
            if name in UPSTREAM_HELPERS or name in found:
                continue
            path = tests_root / "helpers" / f"{name}.py"
            if path.exists():
                visit(path.read_text())
                found.append(name)

    text = test.read_text()
    if _uses_fixture(text, "xla_metrics"):
        text += "\nfrom helpers.xla_metrics import XLACounters\n"
    visit(text)
    return [tests_root / "helpers" / f"{n}.py" for n in found]


def export_helper(helper: Path, test: Path, tests_root: Path) -> Tuple[str, str]:
    """(upstream path, content) of a fork helper module, placed in the helpers package of ``test``'s suite."""
    root = test.relative_to(tests_root).parts[0]
    text = re.sub(r"^(\s*)from helpers(\.| import)", rf"\1from {root}.helpers\2", helper.read_text(), flags=re.M)
    text = re.sub(r"^(\s*)import helpers\.", rf"\1import {root}.helpers.", text, flags=re.M)
    return f"tests/{root}/helpers/{helper.name}", text



def updated_tests(tests_diff: str) -> Dict[str, List[str]]:
    """``{upstream test file: [test functions its hunks change]}`` of a fix's ``tests/`` sections: the test function a
    changed line belongs to (named in the hunk's header or on an earlier line of the hunk)."""
    found: Dict[str, List[str]] = {path: [] for path in touched_files(tests_diff, tree="tests")}
    path, current = None, None
    for line in tests_diff.splitlines():
        m = re.match(r"diff --git a/\S+ b/(\S+)$", line)
        if m:
            path, current = m.group(1), None
            continue
        if path is None or line.startswith(("---", "+++")):
            continue
        m = re.match(r"@@ [^@]* @@(.*)$", line)
        if m:
            named = re.search(r"\bdef (\w+)", m.group(1))
            current = named.group(1) if named else None
            continue
        named = re.match(r"^[-+ ](?:async )?def (\w+)", line)
        if named:
            current = named.group(1)
        if line[:1] in "+-" and current and current.startswith("test_") and current not in found[path]:
            found[path].append(current)
    return found


def test_names(content: str) -> List[str]:
    return re.findall(r"^(?:async )?def (test_\w+)", content, flags=re.M) + [
        f"{cls}" for cls in re.findall(r"^class (Test\w+)", content, flags=re.M)]


#: what became of each fix on upstream's current line, Lightning 2.6.6 (read in its source, measured by the 2.6.6
#: series' tests where one is named); shown in docs/upstream-prs.md
TPU_ONLY_RE = re.compile(r"^@RunIf\([^)]*\btpu=True[^)]*\)\s*\n(?:@[^\n]*\n)*def (test_\w+)", re.M)


def real_tpu_tests(tests_root: Optional[Path] = None) -> List[str]:
    """The fork's tests that need real TPU hardware (``RunIf(tpu=True)`` in the fork). Exported, they carry upstream's
    ``RunIf(tpu=True)`` like every XLA test, which an XLA:CPU device satisfies, so ``check-tag`` leaves them out."""
    tests_root = common.ROOT / "tests" if tests_root is None else tests_root
    return sorted({name for root in TEST_ROOTS for path in (tests_root / root).rglob("test_*.py")
                   for name in TPU_ONLY_RE.findall(path.read_text())})


