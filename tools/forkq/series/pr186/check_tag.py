"""``check-tag``: the exported series on upstream's real tag 1.8.6.

It needs a clone of upstream's repository (any clone holding tag ``1.8.6``; the tree of the tag's ``src/``,
``tests/`` and packaging files is used, so large binary files under ``docs/`` need not be present). It ``git am``s
the series onto that tree, applies the fork's compatibility patches on top (only so that the tag's code imports on
this machine's torch, torch_xla and NumPy; they are not part of the series), and collects, then runs, the tests the
series adds and the upstream tests it updates under upstream's own pytest configuration (``setup.cfg``:
``--strict-markers``, its conftest files). The result is written to ``results/pr-series-1.8.6.json`` and shown in
``docs/upstream-prs.md``.
"""
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional

from ... import common, stamp
from ...common import ForkError, commit, git
from ...patchfile import Patch
from ...seriesfile import read_series
from ...upstream import TAG, unpack_tag
from .. import engine
from .testmodules import real_tpu_tests, updated_tests
from .verify import BASE_DATE

CHECK_RESULT = common.ROOT / "results" / "pr-series-1.8.6.json"


def check_tag(upstream_git: Path, series_dir: Path, run: bool = True, patch_dir: Optional[Path] = None,
              result_file: Optional[Path] = CHECK_RESULT) -> Dict:
    """``git am`` the exported series onto upstream's tag 1.8.6 and collect (and run) its tests there."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    mboxes = [series_dir / n for n in read_series(series_dir / "series")]
    if not mboxes:
        raise ForkError(f"{series_dir} holds no series: run `make pr-series` first")
    compats = [n for n in read_series(patch_dir / "series") if Patch.read(patch_dir / n).kind == "compat"]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "lightning-1.8.6"
        if unpack_tag(upstream_git, tree) is None:
            raise ForkError(f"{upstream_git} is no git clone that holds upstream's tag {TAG}")
        git(["init", "-q"], cwd=tree)
        git(["add", "-A"], cwd=tree)
        commit(tree, "1.8.6", "upstream <upstream@localhost>", BASE_DATE)
        for mbox in mboxes:
            proc = git(["am", "-q", str(mbox)], cwd=tree, check=False)
            if proc.returncode != 0:
                raise ForkError(f"git am {mbox.name} failed on upstream's tag 1.8.6:\n{proc.stdout}{proc.stderr}")
        added = [line for line in git(["diff", "--name-only", "--diff-filter=A", f"HEAD~{len(mboxes)}", "HEAD", "--",
                                        "tests"], cwd=tree).stdout.split() if Path(line).name.startswith("test_")]
        # upstream's own tests that a fix updates because it changes their behaviour on purpose: run those tests too
        updated = [f"{path}::{name}" for m in mboxes
                   for path, names in updated_tests(Patch.read(m).tests_diff)
                   .items() if path not in added for name in names]
        for name in compats:
            proc = git(["apply", str(patch_dir / name)], cwd=tree, check=False)
            if proc.returncode != 0:
                raise ForkError(f"compat patch {name} does not apply on top of the series:\n{proc.stderr}")
        env = dict(os.environ, PYTHONPATH=str(tree / "src"), PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))
        collect, nodes = engine.collect(["--color=no", *added, *updated], cwd=tree, env=env)
        collected = {"tests collected": len(nodes),
                     **engine.counts(c["outcome"] for c in collect.cases if c["outcome"] == "error")}
        result: Dict = {"tag": "1.8.6", "patches": [m.name for m in mboxes], "test_modules": added,
                        "updated_upstream_tests": updated,
                        "compat_applied_on_top": compats, "collect": collected,
                        "collect_ok": collect.returncode == 0}
        if collect.returncode != 0:
            result["collect_output"] = collect.output[-4000:]
        if run and collect.returncode == 0:
            defined = {name for module in added for name in re.findall(r"^def (test_\w+)", (tree / module).read_text(),
                                                                        flags=re.M)}
            tpu_only = [name for name in real_tpu_tests() if name in defined]
            result["not_run_needs_real_tpu"] = tpu_only
            select = ["-k", " and ".join(f"not {name}" for name in tpu_only)] if tpu_only else []
            # the whole output stays beside the exported series (the result keeps its end only): the tracebacks
            log = series_dir.parent / f"{series_dir.name}-check-tag.log"
            ran = engine.run_pytest(["-q", "--color=no", "-rsfE", "--tb=short", *select, *added, *updated], cwd=tree,
                                    env=env, log=log)
            result["run"] = engine.counts(engine.outcome(c) for c in ran.cases)
            result["run_ok"] = ran.returncode == 0
            if ran.returncode != 0:
                result["run_output"] = ran.output[-4000:]
        import torch

        result["versions"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                              "pytest": __import__("pytest").__version__}
    if result_file is not None:
        result_file.parent.mkdir(parents=True, exist_ok=True)
        from ...figures import fixes_version

        # what the check depends on: the fix and compat patches (a changed feature patch leaves it current)
        inputs = fixes_version(patch_dir)
        result_file.write_text(json.dumps({"stamp": stamp.make(patch_dir, inputs=inputs), **result}, indent=1) + "\n")
    return result


