#!/usr/bin/env python3
"""Show that every fix of the series is what makes its tests pass.

For each ``Kind: fix`` patch of ``patches/series`` this finds the test modules that declare
``FIXED_BY = "<that patch>"``, materializes two trees (the series up to the patch before it, and up to the patch
itself) and runs those modules against each tree on the XLA device:

- without the patch, every test must fail, except the ones marked ``@pytest.mark.guard`` (regression guards that
  were already right and must stay right);
- with the patch, every test must pass.

A skipped test proves nothing either way and counts as a failure of the check. Exit status 0 only when every fix
passes both halves.

    python tools/before_after.py [--only 0005] [--workers 2]
"""
import argparse
import ast
import importlib.util
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fork_tool", ROOT / "tools" / "fork.py")
fork = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fork)

FIXED_BY_RE = re.compile(r'^FIXED_BY\s*=\s*["\']([^"\']+)["\']', re.M)


def fixed_by_map(tests_dir: Path = ROOT / "tests") -> Dict[str, List[Path]]:
    """``{patch name: [test modules that declare it]}``."""
    mapping: Dict[str, List[Path]] = {}
    for path in sorted(tests_dir.rglob("test_*.py")):
        text = path.read_text()
        if not FIXED_BY_RE.search(text):
            continue
        # only a module-level assignment counts, not the text of a test that writes such a module
        for node in ast.parse(text).body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "FIXED_BY" and isinstance(node.value, ast.Constant)):
                mapping.setdefault(str(node.value.value), []).append(path)
    return mapping


def fix_patches() -> List[Tuple[Optional[str], str]]:
    """``[(previous patch or None, fix patch)]`` in series order."""
    series = fork.read_series()
    out = []
    for i, name in enumerate(series):
        kind = fork.parse_patch((fork.PATCH_DIR / name).read_text())["trailers"].get("Kind")
        if kind == "fix":
            out.append((series[i - 1] if i else None, name))
    return out


def run_pytest(src: Path, modules: List[Path], junit: Path, workers: int, extra: List[str]) -> Dict[str, str]:
    """Run ``modules`` against the tree ``src``; return ``{test id: passed|failed|skipped}``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(src), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("PJRT_DEVICE", "CPU")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
           *(["-n", str(workers)] if workers > 1 else []), *extra, *map(str, modules)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if not junit.exists():
        raise SystemExit(f"pytest did not run (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    outcomes: Dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        if case.find("skipped") is not None:
            outcomes[test_id] = "skipped"
        elif case.find("failure") is not None or case.find("error") is not None:
            outcomes[test_id] = "failed"
        else:
            outcomes[test_id] = "passed"
    return outcomes


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="check only this fix (patch name or number)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    mapping = fixed_by_map()
    fixes = fix_patches()
    if args.only:
        fixes = [(b, n) for b, n in fixes if n == args.only or n.split("-", 1)[0] == args.only]
        if not fixes:
            print(f"no fix patch matches {args.only!r}", file=sys.stderr)
            return 2
    unknown = sorted(set(mapping) - set(fork.read_series()))
    problems: List[str] = [f"FIXED_BY names {name!r}, which is not in the series" for name in unknown]
    work = ROOT / "build" / "before-after"
    notes: List[str] = []
    rows = []
    for before, name in fixes:
        modules = mapping.get(name, [])
        if not modules:
            problems.append(f"{name}: no test module declares FIXED_BY = {name!r}")
            continue
        tag = name.split("-", 1)[0]
        trees = {}
        for label, upto in (("before", before or "upstream"), ("after", name)):
            trees[label] = fork.materialize(work / tag / label / "src", upto=upto, quiet=True)
        before_out = run_pytest(trees["before"], modules, work / tag / "before.xml", args.workers, ["-m", "not guard"])
        after_out = run_pytest(trees["after"], modules, work / tag / "after.xml", args.workers, [])
        # a test skipped on both trees needs hardware this machine lacks (`tpu`): it is reported, not judged
        not_here = sorted(t for t, o in before_out.items() if o == "skipped" and after_out.get(t) == "skipped")
        for test_id in not_here:
            notes.append(f"{name}: {test_id} skipped on both trees (needs hardware this machine lacks)")
            before_out.pop(test_id)
            after_out.pop(test_id, None)
        if not before_out:
            problems.append(f"{name}: no test ran without the patch")
        for test_id, outcome in sorted(before_out.items()):
            if outcome != "failed":
                problems.append(f"{name}: {test_id} {outcome} WITHOUT the patch (must fail)")
        for test_id, outcome in sorted(after_out.items()):
            if outcome != "passed":
                problems.append(f"{name}: {test_id} {outcome} WITH the patch (must pass)")
        n_fail = sum(o == "failed" for o in before_out.values())
        n_pass = sum(o == "passed" for o in after_out.values())
        rows.append(f"| {name} | {len(modules)} | {n_fail}/{len(before_out)} fail | {n_pass}/{len(after_out)} pass |")
        print(rows[-1], flush=True)

    print("\n| fix | test modules | without the patch | with the patch |\n|---|---|---|---|")
    print("\n".join(rows))
    if notes:
        print("\nnot checkable here:\n  " + "\n  ".join(notes))
    if problems:
        print("\nbefore/after check FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(f"\nbefore/after check OK for {len(rows)} fixes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
