"""The one reader of ``FIXED_BY``: the module-level constant with which a test module names the fix patch it proves
(``before-after`` runs it without and with that patch, ``pr-series`` exports it with the patch, without the line).
Standard library only."""
import ast
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .common import ForkError


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
