"""One command table behind ``tools/fork.py`` (``forkq.commands``): each command one module, every command's
``--help`` works, ``--help`` imports no command, and each command has one name: ``tools/`` holds no other script
that runs a command, and the Makefile, the docs, the workflows and CI name each one as ``tools/fork.py <command>``.
And one home for each job: one argument parser, one pytest runner and one JUnit reader, one reader of a patch's
header; and no module of ``forkq`` imports ``cli``, which runs them."""
import importlib
import re
import subprocess
import sys

import pytest

from forkq import common
from forkq.commands import COMMANDS, create_command
from forkq.commands.base import Command

TOOLS = common.ROOT / "tools"
# the scripts of tools/: the one entry point, and the interpreter check that must run on any Python 3
SCRIPTS = ["check_python.py", "fork.py"]
# the scripts that once gave a command a second and third name
GONE = ["pr_series.py", "pr_series_266.py", "before_after.py", "upstream_tests.py", "unified.py", "readme_bench.py"]
# where commands are named for people and for CI
NAMED_IN = ["Makefile", ".ci/run", ".ci/upstream-tests", "README.md", "docs", "tests/README.md", "tests/helpers",
            ".github/workflows", "scripts", "tools"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)


def test_each_command_is_one_module_with_one_command_class():
    modules = [info.module_path for info in COMMANDS.values()]
    assert len(set(modules)) == len(modules)
    for name, info in COMMANDS.items():
        command = create_command(name)
        assert isinstance(command, Command) and type(command).__name__ == info.class_name
        assert importlib.import_module(info.module_path).__doc__, f"{info.module_path} says what it is for"
    on_disk = {p.stem for p in (TOOLS / "forkq" / "commands").glob("*.py")} - {"__init__", "base"}
    assert on_disk == {m.rsplit(".", 1)[1] for m in modules}


def test_help_lists_every_command_without_importing_one():
    code = ("import sys; sys.argv = ['fork.py', '--help']; sys.path.insert(0, %r)\n"
            "from forkq import cli\ntry:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('forkq.commands.') and m != 'forkq.commands.base'))"
            % str(TOOLS))
    proc = _run("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("[]"), "fork.py --help imported a command module"
    for name, info in COMMANDS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(info.summary[:40])}", proc.stdout, flags=re.M), name


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_its_help(name):
    proc = _run(str(TOOLS / "fork.py"), name, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith(f"usage: fork.py {name}"), proc.stderr


def test_each_command_has_one_name():
    assert sorted(p.name for p in TOOLS.glob("*.py")) == SCRIPTS
    stale = []
    for place in NAMED_IN:
        root = common.ROOT / place
        for path in sorted([root] if root.is_file() else (p for p in root.rglob("*") if p.is_file())):
            if "__pycache__" in path.parts:
                continue
            for number, line in enumerate(path.read_bytes().decode(errors="replace").splitlines(), 1):
                stale += [f"{path.relative_to(common.ROOT)}:{number}: {name}" for name in GONE
                          if re.search(rf"(?<![\w/.]){re.escape(name)}|tools/{re.escape(name)}", line)]
    assert not stale, "name these commands as `python3 tools/fork.py <command>`:\n" + "\n".join(stale)


def test_errors_name_the_command_and_give_no_traceback():
    proc = _run(str(TOOLS / "fork.py"), "before-after", "--only", "9999")
    assert proc.returncode == 2
    assert "fork.py: error: no fix patch matches '9999'" in proc.stderr and "Traceback" not in proc.stderr
    proc = _run(str(TOOLS / "fork.py"), "no-such-command")
    assert proc.returncode == 2 and "invalid choice: 'no-such-command'" in proc.stderr


def _grep(pattern: str) -> list:
    return sorted(str(p.relative_to(TOOLS)) for p in TOOLS.rglob("*.py") if re.search(pattern, p.read_text()))


def test_one_home_for_each_job():
    assert _grep(r"ArgumentParser\(") == ["forkq/cli.py"]
    assert _grep(r'"-m", "pytest"') == ["forkq/series/engine.py"]
    assert _grep(r'iter\("testcase"\)') == ["forkq/series/engine.py"]
    assert _grep(r'\.get\("Kind"|\["Kind"\]') == ["forkq/patchfile.py"]
    # one splicer of the generated blocks of a page (the README's, bench/README.md's)
    assert _grep(r"(?m)^def splice\(") == ["forkq/blocks.py"]
    assert _grep(r"from \.blocks import splice") == ["forkq/authoring.py", "forkq/bench_readme.py"]
    # the 1.8.6 series is one module per job, and no other module reaches into one's private names
    assert not _grep(r"pr186\._|pr186\.\w+\._")
    assert not (TOOLS / "forkq" / "series" / "pr186.py").exists()
