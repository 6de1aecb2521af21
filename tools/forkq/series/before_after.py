"""Show that every fix of the series is what makes its tests pass.

For each ``Kind: fix`` patch of ``patches/1.8.6/series`` this finds the test modules that declare
``FIXED_BY = "<that patch>"``, materializes two trees (the series up to the patch before it, and up to the patch
itself) and runs those modules against each tree on the XLA device:

- without the patch, every test must fail, except the ones marked ``@pytest.mark.guard`` (regression guards that
  were already right and must stay right);
- with the patch, every test must pass.

A skipped test proves nothing either way: skipped on both trees (it needs hardware this machine lacks, such as a
TPU), it is reported and not judged; skipped on one tree only, it fails that half of the check (it neither failed
without the patch nor passed with it). Exit status 0 only when every fix passes both halves.

    python3 tools/fork.py before-after [--only NAME] [--workers 2]    (make before-after)
"""
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .. import common
from ..common import ForkError, match_patch
from ..fixedby import fixed_by_map
from ..patchfile import Patch
from ..seriesfile import read_series
from ..tree import materialize
from . import engine


def fix_patches() -> List[Tuple[Optional[str], str]]:
    """``[(previous patch or None, fix patch)]`` in series order."""
    series = read_series()
    out = []
    for i, name in enumerate(series):
        if Patch.read(common.PATCH_DIR / name).kind == "fix":
            out.append((series[i - 1] if i else None, name))
    return out


def outcomes(src: Path, modules: List[Path], junit: Path, workers: int, extra: List[str]) -> Dict[str, str]:
    """Run ``modules`` against the tree ``src``; return ``{test id: passed|failed|skipped}`` (an error counts as
    failed)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = engine.pythonpath(src, inherit=True)
    env.setdefault("PJRT_DEVICE", "CPU")
    args = ["-q", *(["-n", str(workers)] if workers > 1 else []), *extra, *map(str, modules)]
    run = engine.run_pytest(args, cwd=common.ROOT, env=env, junit=junit)
    if not junit.exists():
        raise ForkError(f"pytest did not run (exit {run.returncode}):\n{run.tail}")
    return {f"{c['classname']}::{c['name']}": "failed" if c["outcome"] == "error" else c["outcome"]
            for c in run.cases}


def check(only: Optional[str] = None, workers: int = 2) -> int:
    """Check every fix (or the one ``only`` names), print the table and what failed; 0 when every fix passes."""
    mapping = fixed_by_map(common.ROOT / "tests")
    fixes = fix_patches()
    if only:
        name = match_patch([n for _, n in fixes], only)
        fixes = [(b, n) for b, n in fixes if n == name]
        if not fixes:
            raise ForkError(f"no fix patch matches {only!r}")
    unknown = sorted(set(mapping) - set(read_series()))
    problems: List[str] = [f"FIXED_BY names {name!r}, which is not in the series" for name in unknown]
    work = common.ROOT / "build" / "before-after"
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
            trees[label] = materialize(work / tag / label / "src", upto=upto, quiet=True)
        before_out = outcomes(trees["before"], modules, work / tag / "before.xml", workers, ["-m", "not guard"])
        after_out = outcomes(trees["after"], modules, work / tag / "after.xml", workers, [])
        # a test skipped with the patch and skipped (or not reported) without it needs hardware this machine lacks
        # (`tpu`): it is reported, not judged
        not_here = sorted(t for t, o in after_out.items()
                          if o == "skipped" and before_out.get(t, "skipped") == "skipped")
        for test_id in not_here:
            notes.append(f"{name}: {test_id} skipped on both trees (needs hardware this machine lacks)")
            before_out.pop(test_id, None)
            after_out.pop(test_id)
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
