"""Code the tests share lives in ``tests/helpers`` (or, for the tools' tests, in a non-test module of ``tests_fork``),
never in a test module that another one imports: importing a test module runs its module-level code (its
``importorskip``, its ``FIXED_BY``) in the importer, a test function imported with it is collected twice, and
``fork.py pr-series`` exports a fix's modules with the ``helpers`` they import, not with the test modules they import.

Every module under ``tests_pytorch``, ``tests_lite`` and ``helpers`` is read, its imports and the code it hands to a
fresh interpreter as a string alike (a line that starts with ``from tests_pytorch`` inside a snippet counts). In
``tests_fork`` only real imports count (of ``tests_fork.test_*``): its strings hold upstream's layout on purpose
(``tests_pytorch.helpers``, as ``pr_series`` exports it)."""
import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# the test packages, imported as packages: tests_pytorch.<anything>, tests_lite.<anything>
FORBIDDEN = re.compile(r"^(tests_pytorch|tests_lite)(\.|$)")
# a test module of the tools' tests (their shared code is in synthetic.py, upstream_queue.py, conftest.py)
FORBIDDEN_IN_FORK = re.compile(r"^tests_fork\.test_")
SNIPPET_IMPORT = re.compile(r"^\s*(?:from\s+(\S+)\s+import\b|import\s+(\S+))", re.M)


def _imported_modules(source: str, snippets: bool = True):
    """(line, module) for every import statement and, with ``snippets``, every import line inside a string."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif snippets and isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in SNIPPET_IMPORT.finditer(node.value):
                module = (match.group(1) or match.group(2)).rstrip(",;")
                yield node.lineno + node.value.count("\n", 0, match.start()), module


def _offences(root: Path, forbidden=FORBIDDEN, snippets: bool = True):
    for path in sorted(root.rglob("*.py")):
        for line, module in sorted(_imported_modules(path.read_text(), snippets)):
            if forbidden.search(module):
                yield f"{path.relative_to(root.parent)}:{line}: imports {module}"


@pytest.mark.parametrize("folder", ["tests_pytorch", "tests_lite", "helpers"])
def test_no_test_module_imports_another(folder):
    offences = list(_offences(TESTS / folder))
    assert not offences, "move what these share into tests/helpers:\n" + "\n".join(offences)


def test_no_tool_test_imports_another():
    offences = list(_offences(TESTS / "tests_fork", FORBIDDEN_IN_FORK, snippets=False))
    assert not offences, "move what these share into a non-test module of tests_fork:\n" + "\n".join(offences)


def test_the_check_sees_imports_in_code_and_in_snippets(tmp_path):
    root = tmp_path / "tests_pytorch"
    root.mkdir()
    (root / "test_a.py").write_text(
        "import os\n"
        "from helpers.runif import RunIf\n"
        "from tests_pytorch.strategies.test_xla_spmd import TOLERANCE\n"
        "import tests_lite.test_b\n"
        "\n\ndef test_x():\n"
        "    from tests_pytorch.test_c import run\n"
        "    code = \'\'\'\n    import sys\n    from tests_lite.strategies.test_xla_pjrt import Loop\n    \'\'\'\n"
    )
    (root / "test_ok.py").write_text(
        '"""Mentions tests_pytorch in prose, and pr_series rewrites helpers to tests_pytorch.helpers."""\n'
        "from helpers.xla_spmd_checks import TOLERANCE\nfrom tests_fork.synthetic import git\n"
    )
    assert list(_offences(root)) == [
        "tests_pytorch/test_a.py:3: imports tests_pytorch.strategies.test_xla_spmd",
        "tests_pytorch/test_a.py:4: imports tests_lite.test_b",
        "tests_pytorch/test_a.py:8: imports tests_pytorch.test_c",
        "tests_pytorch/test_a.py:11: imports tests_lite.strategies.test_xla_pjrt",
    ]
    (root / "test_fork.py").write_text("from tests_fork.test_fork_tool import queue\nimport tests_fork.synthetic\n")
    assert list(_offences(root, FORBIDDEN_IN_FORK, snippets=False)) == [
        "tests_pytorch/test_fork.py:1: imports tests_fork.test_fork_tool"]
