"""Code the tests share lives in ``tests/helpers`` (or, for the tools' tests, in a non-test module of ``tests_fork``),
never in a test module that another one imports: importing a test module runs its module-level code (its
``importorskip``, its ``FIXED_BY``) in the importer, a test function imported with it is collected twice, and
``fork.py pr-series`` exports a fix's modules with the ``helpers`` they import, not with the test modules they import.

Every module under ``tests_pytorch``, ``tests_lite`` and ``helpers`` is read, its imports and the code it hands to a
fresh interpreter as a string alike (a line that starts with ``from tests_pytorch`` inside a snippet counts). In
``tests_fork`` only real imports count (of ``tests_fork.test_*``): its strings hold upstream's layout on purpose
(``tests_pytorch.helpers``, as ``pr_series`` exports it).

A test module is not loaded by path either, in any folder: ``importlib``'s ``spec_from_file_location`` (or
``SourceFileLoader``, ``imp.load_source``), ``runpy``, ``exec`` of its text, ``import_module`` of its name, or its
file handed to a fresh interpreter (running pytest on it is collecting it, not loading it). The file is known by its
name, ``test_*.py``, in the call's arguments or in what the names they use were assigned."""
import ast
import re
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Set

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


# --------------------------------------------------------------------------------------------- loads by path
# the calls that load a module from a file (the argument that names it: its position, its keyword)
PATH_LOADERS = {"spec_from_file_location": (1, "location"), "SourceFileLoader": (1, "path"),
                "load_source": (1, "pathname"), "run_path": (0, "path_name")}
# the calls that load a module by name
NAME_LOADERS = {"import_module", "run_module", "__import__"}
# the calls that run a file's text in this interpreter
TEXT_RUNNERS = {"exec", "compile"}
# the calls that start a fresh interpreter
SUBPROCESS = {"run", "Popen", "call", "check_call", "check_output", "run_python", "execv", "execve", "execl",
              "execvp", "spawnv", "create_subprocess_exec"}
TEST_FILE = re.compile(r"(?:^|[/\\])test_\w*\.py$")
TEST_FILE_IN_TEXT = re.compile(r"test_\w*\.py\b")
SNIPPET_LOAD = re.compile(r"spec_from_file_location|SourceFileLoader|load_source|runpy|exec\(\s*open\(")


def _callee(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _assignments(tree: ast.AST) -> Dict[str, List[ast.AST]]:
    """``{name: [the values assigned to it anywhere in the module]}``."""
    found: Dict[str, List[ast.AST]] = {}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None else []
        for target in targets:
            if isinstance(target, ast.Name):
                found.setdefault(target.id, []).append(node.value)
    return found


def _strings(nodes, assigned: Dict[str, List[ast.AST]], seen: Set[str]) -> Iterator[str]:
    """The string constants in ``nodes`` and in what the names they use were assigned."""
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                yield sub.value
            elif isinstance(sub, ast.Name) and sub.id in assigned and sub.id not in seen:
                seen.add(sub.id)
                yield from _strings(assigned[sub.id], assigned, seen)


def _loads_by_path(source: str, snippets: bool = True) -> Iterator[tuple]:
    """(line, what) for every load of a test module that is not an import statement; with ``snippets``, also in the
    code a string holds."""
    tree = ast.parse(source)
    assigned = _assignments(tree)
    for node in ast.walk(tree):
        if snippets and isinstance(node, ast.Constant) and isinstance(node.value, str) and SNIPPET_LOAD.search(
                node.value):
            named = TEST_FILE_IN_TEXT.search(node.value)
            if named:
                yield node.lineno, f"hands a fresh interpreter code that loads {named.group(0)} by path"
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node)
        if name in PATH_LOADERS:
            position, keyword = PATH_LOADERS[name]
            args = node.args[position:position + 1] + [k.value for k in node.keywords if k.arg == keyword]
            files = [s for s in _strings(args, assigned, set()) if TEST_FILE.search(s)]
            if files:
                yield node.lineno, f"loads {files[0]} by path ({name})"
        elif name in NAME_LOADERS:
            modules = [s for s in _strings(node.args[:1], assigned, set())
                       if re.fullmatch(r"[\w.]+", s) and s.rsplit(".", 1)[-1].startswith("test_")]
            if modules:
                yield node.lineno, f"loads {modules[0]} by name ({name})"
        elif name in TEXT_RUNNERS:
            files = [s for s in _strings(node.args[:1], assigned, set()) if TEST_FILE.search(s)]
            if files:
                yield node.lineno, f"runs the text of {files[0]} ({name})"
        elif name in SUBPROCESS:
            strings = list(_strings([*node.args, *(k.value for k in node.keywords)], assigned, set()))
            files = [s for s in strings if TEST_FILE.search(s)]
            if files and not any("pytest" in s for s in strings):
                yield node.lineno, f"hands {files[0]} to a fresh interpreter ({name})"


def _path_offences(root: Path, snippets: bool = True):
    for path in sorted(root.rglob("*.py")):
        for line, what in sorted(set(_loads_by_path(path.read_text(), snippets))):
            yield f"{path.relative_to(root.parent)}:{line}: {what}"


@pytest.mark.parametrize("folder", ["tests_pytorch", "tests_lite", "helpers", "tests_fork"])
def test_no_test_module_is_loaded_by_path(folder):
    # the tools' tests write such code into files on purpose (this module does): there only real calls count
    offences = list(_path_offences(TESTS / folder, snippets=folder != "tests_fork"))
    assert not offences, "import what these share from tests/helpers instead:\n" + "\n".join(offences)


def test_the_check_sees_loads_by_path(tmp_path):
    root = tmp_path / "tests_fork"
    root.mkdir()
    (root / "test_loads.py").write_text(textwrap.dedent('''\
        import importlib.util, runpy, subprocess, sys
        from pathlib import Path
        REPO = Path(__file__).parents[2]


        def test_spec():
            path = REPO / 'tests' / 'tests_pytorch' / 'tpu' / 'test_xla_ddp_sync.py'
            spec = importlib.util.spec_from_file_location('ddp_sync_under_check', path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))


        def test_runpy():
            runpy.run_path(str(REPO / 'tests/tests_lite/test_a.py'))
            runpy.run_module('tests_pytorch.trainer.test_b')


        def test_exec():
            exec(open('tests/tests_pytorch/test_c.py').read())


        def test_subprocess():
            target = f'{REPO}/tests/tests_pytorch/test_d.py'
            subprocess.run([sys.executable, target], check=True)
            subprocess.run([sys.executable, '-c', 'import runpy; runpy.run_path("tests/test_e.py")'])
        '''))
    # a file that is no test module may be loaded by path; pytest may be handed a test file to collect
    (root / "test_fine.py").write_text(textwrap.dedent('''\
        import importlib.util, subprocess, sys
        EXAMPLE = 'examples/train_xla.py'
        spec = importlib.util.spec_from_file_location('example', EXAMPLE)
        subprocess.run([sys.executable, '-m', 'pytest', 'tests/tests_pytorch/test_d.py'])
        subprocess.run([sys.executable, 'tools/fork.py', 'check'])
        '''))
    assert list(_path_offences(root)) == [
        "tests_fork/test_loads.py:8: loads test_xla_ddp_sync.py by path (spec_from_file_location)",
        "tests_fork/test_loads.py:13: loads tests/tests_lite/test_a.py by path (run_path)",
        "tests_fork/test_loads.py:14: loads tests_pytorch.trainer.test_b by name (run_module)",
        "tests_fork/test_loads.py:18: runs the text of tests/tests_pytorch/test_c.py (exec)",
        "tests_fork/test_loads.py:23: hands /tests/tests_pytorch/test_d.py to a fresh interpreter (run)",
        "tests_fork/test_loads.py:24: hands a fresh interpreter code that loads test_e.py by path",
    ]


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
