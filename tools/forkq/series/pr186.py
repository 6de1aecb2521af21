"""Export the fork's upstream fixes (``Kind: fix`` patches) as a numbered ``git am`` series for upstream's tag 1.8.6.

Each exported patch is one pull request: the fix's source change (with the CHANGELOG entry the fix patch carries),
its updates of upstream's own tests (the patch's ``tests/`` sections, written against the tag's files, as they are),
plus the fork's test modules that declare ``FIXED_BY = "<that patch>"``, moved to where upstream keeps them
(``tests/tests_pytorch/X.py`` -> ``tests/tests_pytorch/X.py``), with our local helper imports rewritten to upstream's
(``from helpers.runif import RunIf`` -> ``from tests_pytorch.helpers.runif import RunIf``) and the ``FIXED_BY``
constant removed. Compat patches are not exported: a fix that only applies on top of a compat patch's changes is
reported, naming the compat patch, and nothing is written.

The export verifies itself: a git repository made from the pinned upstream tree (the wheel's packages are the tag's
``src/``) takes the series with ``git am``, and every source file it touches must equal the tree materialized from
a queue holding only the fix patches.

``check-tag`` takes the exported series to upstream's real tag: it needs a clone of upstream's repository (any clone
holding tag ``1.8.6``; the tree of the tag's ``src/``, ``tests/`` and packaging files is used, so large binary files
under ``docs/`` need not be present). It ``git am``s the series onto that tree, applies the fork's compatibility
patches on top (only so that the tag's code imports on this machine's torch, torch_xla and NumPy; they are not part
of the series), and collects, then runs, the tests the series adds and the upstream tests it updates under
upstream's own pytest configuration (``setup.cfg``: ``--strict-markers``, its conftest files). The result is written
to ``results/pr-series-1.8.6.json`` and shown in ``docs/upstream-prs.md``.

Commands::

    pr_series.py export [--out build/pr-series] [--doc docs/upstream-prs.md]
    pr_series.py check-tag --upstream-git PATH [--series build/pr-series] [--no-run]
"""
import argparse
import ast
import email.header
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .. import common
from ..common import AUTHOR, UPSTREAM_TESTS, ForkError, commit, git
from ..patchfile import Patch, drop_fixed_by, fixed_by_map, merge_diffs, read_series, touched_files, with_diff
from ..tree import materialize
from ..upstream import fetch_wheel, read_lock, unpack_packages
from . import engine

TEST_ROOTS = ("tests_pytorch", "tests_lite")
BASE_DATE = "2022-12-21T00:00:00+0000"  # the commit standing for tag 1.8.6 in the verification repository
# fork-only names that upstream's 1.8.6 test suite does not have; reported in the PR description
FORK_ONLY = {
    "min_torch_xla": "`RunIf(min_torch_xla=...)` is the fork's; upstream's RunIf has no such argument",
}


# --------------------------------------------------------------------------------------------- discovery
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
    """``@pytest.mark.guard`` is the fork's bookkeeping for ``tools/before_after.py`` (a test that already passed before
    the fix) and ``@pytest.mark.slow`` its scheduling hint; upstream's configuration (``--strict-markers``) knows
    neither. The decorator goes, its
    comment stays as a plain comment."""
    text = GUARD_DECORATOR_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}\n" if m.group(2) else "", text)
    return GUARD_PARAM_RE.sub("", text)


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
    text = re.sub(r"^(\s*)from helpers(\.| import)", rf"\1from {root}.helpers\2", text, flags=re.M)
    text = re.sub(r"^(\s*)import helpers\.", rf"\1import {root}.helpers.", text, flags=re.M)
    # the fork's RunIf(xla=True) runs on an XLA device of any kind; upstream's 1.8.6 equivalent is tpu=True
    text = re.sub(r"(RunIf\([^)]*?)\bxla=True", r"\1tpu=True", text)
    text = re.sub(r"RunIf\(tpu=True, tpu=True", "RunIf(tpu=True", text)
    warnings = [f"{rel}: {why}" for word, why in FORK_ONLY.items() if re.search(rf"\b{word}\b", text)]
    if re.search(r"\bFIXED_BY\b", text):
        warnings.append(f"{rel}: still mentions FIXED_BY")
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


def _fork_helpers(test: Path, tests_root: Path) -> List[Path]:
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


# --------------------------------------------------------------------------------------------- git
def upstream_repo(dest: Path, lock: Dict, cache_dir: Path) -> Path:
    """A git repository holding upstream's ``src/`` at 1.8.6 in one commit tagged ``1.8.6``."""
    dest.mkdir(parents=True)
    wheel = fetch_wheel("pytorch-lightning", lock["pytorch-lightning"], cache_dir)
    unpack_packages(wheel, dest / "src")
    git(["init", "-q"], cwd=dest)
    git(["add", "-A"], cwd=dest)
    commit(dest, "1.8.6", "upstream <upstream@localhost>", BASE_DATE)
    git(["tag", "1.8.6"], cwd=dest)
    return dest


def _decode(value: str) -> str:
    return str(email.header.make_header(email.header.decode_header(value)))


def _compat_culprits(fix: Patch, compats: Sequence[Patch]) -> List[str]:
    files = set(fix.files)
    return [f"{c.name} (also changes {', '.join(sorted(files & set(c.files)))})"
            for c in compats if files & set(c.files)]


# --------------------------------------------------------------------------------------------- export
class Plan:
    def __init__(self, fixes: List[Patch], compats: List[Patch], tests: Dict[str, List[Path]],
                 features: Optional[List[Patch]] = None):
        self.fixes, self.compats, self.tests = fixes, compats, tests
        self.features = features or []


def plan(patch_dir: Path, tests_root: Path) -> Plan:
    infos = [Patch.read(patch_dir / n) for n in read_series(patch_dir / "series")]
    # only the fixes go upstream; the compat patches are what they may depend on; features (new strategies) are the
    # fork's own and neither
    return Plan([i for i in infos if i.kind == "fix"], [i for i in infos if i.kind == "compat"],
                fix_tests(tests_root), [i for i in infos if i.kind == "feature"])


def export(out: Path, doc: Optional[Path] = None, patch_dir: Optional[Path] = None,
           tests_root: Optional[Path] = None, lock_file: Optional[Path] = None,
           cache_dir: Optional[Path] = None) -> List[Path]:
    """Write the PR series to ``out`` (and the PR descriptions to ``doc``); return the mbox files."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    tests_root = common.ROOT / "tests" if tests_root is None else tests_root
    out = out.resolve()  # git writes the mboxes from inside the scratch repository
    lock = read_lock(lock_file)
    p = plan(patch_dir, tests_root)
    # the tests of a feature patch stay in the fork, as the feature does
    stray = sorted(set(p.tests) - {f.name for f in p.fixes} - {f.name for f in p.features})
    problems = [f"{', '.join(str(t) for t in p.tests[s])}: FIXED_BY names {s!r}, which is no fix patch of the series"
                for s in stray]
    records: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = upstream_repo(Path(tmp) / "upstream", lock, cache_dir)
        for fix in p.fixes:
            # the wheel's tree has no tests/: the fix's updates of upstream's tests join its mbox after format-patch
            proc = git(["apply", "--index", "--whitespace=nowarn", f"--exclude={UPSTREAM_TESTS}*",
                         str(fix.path)], cwd=repo, check=False)
            if proc.returncode != 0:
                culprits = _compat_culprits(fix, p.compats)
                errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
                problems.append(
                    f"{fix.name} does not apply to upstream 1.8.6 plus the fixes before it"
                    + (f"; it depends on the context of compat patch(es): {'; '.join(culprits)}" if culprits else "")
                    + ".\n    " + "\n    ".join(errors or proc.stderr.splitlines())
                    + "\n    Rework the fix so that it does not touch lines the compat patches change (or move the "
                      "shared change into the fix) and refresh it."
                )
                continue
            tests, warnings = [], []
            if not p.tests.get(fix.name):
                warnings.append("no test module declares FIXED_BY for this fix: the PR has no test")
            for test in p.tests.get(fix.name, []):
                # fork helper modules a test imports (upstream has its own `runif`) go into the first PR needing them
                for helper in _fork_helpers(test, tests_root):
                    helper_path, helper_text = export_helper(helper, test, tests_root)
                    if not (repo / helper_path).exists():
                        (repo / helper_path).parent.mkdir(parents=True, exist_ok=True)
                        (repo / helper_path).write_text(helper_text)
                        tests.append((helper_path, helper_text))
                upstream_path, content, warn = export_test(test, tests_root)
                if (repo / upstream_path).exists():
                    problems.append(f"{fix.name}: {upstream_path} exists upstream already; rename {test}")
                (repo / upstream_path).parent.mkdir(parents=True, exist_ok=True)
                (repo / upstream_path).write_text(content)
                tests.append((upstream_path, content))
                warnings += warn
            git(["add", "-A"], cwd=repo)
            bug = fix.trailers.get("Bug", "none")
            message = f"{fix.subject}\n\n{fix.body}\n"
            if bug and bug != "none":
                message += f"\nBug: {bug}\n"
            commit(repo, message, _decode(fix.headers.get("From", AUTHOR)), fix.headers.get("Date", BASE_DATE))
            records.append({"fix": fix, "tests": tests, "warnings": warnings})
        if problems:
            raise ForkError("the PR series cannot be exported:\n  " + "\n  ".join(problems))
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        mboxes: List[Path] = []
        if records:
            names = git(["format-patch", "--zero-commit", "--full-index", "--no-signature", "-N", "-o", str(out),
                          "1.8.6..HEAD"], cwd=repo).stdout.split()
            for i, (name, rec) in enumerate(zip(names, records), 1):
                slug = re.sub(r"^\d{4}-", "", rec["fix"].name)
                target = out / f"{i:04d}-{slug}"
                Path(name).rename(target)
                if rec["fix"].tests_diff:
                    text = target.read_text()
                    diff = merge_diffs(Patch(text).diff, rec["fix"].tests_diff)
                    target.write_text(with_diff(text, diff))
                mboxes.append(target)
                rec["mbox"] = target
        (out / "series").write_text("".join(m.name + "\n" for m in mboxes))
        # each PR on its own: does it apply to the bare tag, without the PRs before it?
        carried = _carried_test_files(p.fixes)
        for rec in records:
            rec["alone"] = _applies_alone(repo, rec["mbox"], carried)
    verify(mboxes, patch_dir, lock_file, cache_dir)
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(render_doc(records, p))
    return mboxes


def _carried_test_files(fixes: Sequence[Patch]) -> List[str]:
    """Upstream's test files the fixes update (their ``tests/`` sections); the tree made from the wheel lacks them,
    so the checks on it leave them out, and ``check-tag`` applies them to the tag's files."""
    return sorted({f for fix in fixes for f in touched_files(fix.tests_diff, tree="tests")})


def _excludes(paths: Sequence[str]) -> List[str]:
    return [f"--exclude={path}" for path in paths]


def _applies_alone(repo: Path, mbox: Path, carried: Sequence[str] = ()) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "wt"
        git(["worktree", "add", "-q", "--detach", str(wt), "1.8.6"], cwd=repo)
        try:
            return git(["apply", "--check", *_excludes(carried), str(mbox)], cwd=wt, check=False).returncode == 0
        finally:
            git(["worktree", "remove", "--force", str(wt)], cwd=repo)


def verify(mboxes: Sequence[Path], patch_dir: Optional[Path] = None, lock_file: Optional[Path] = None,
           cache_dir: Optional[Path] = None) -> Path:
    """``git am`` the series on upstream 1.8.6 and compare each touched source file with upstream + fixes only."""
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    lock = read_lock(lock_file)
    fixes = [n for n in read_series(patch_dir / "series") if Patch.read(patch_dir / n).kind == "fix"]
    carried = _carried_test_files([Patch.read(patch_dir / n) for n in fixes])
    with tempfile.TemporaryDirectory() as tmp:
        repo = upstream_repo(Path(tmp) / "upstream", lock, cache_dir)
        for mbox in mboxes:
            # upstream's test files are not in the wheel's tree; `check-tag` applies their updates to the tag
            proc = git(["am", "-q", "--whitespace=nowarn", *_excludes(carried), str(mbox)], cwd=repo, check=False)
            if proc.returncode != 0:
                raise ForkError(f"git am {mbox.name} failed on upstream 1.8.6:\n{proc.stdout}{proc.stderr}")
        queue = Path(tmp) / "fixes-only"
        queue.mkdir()
        for name in fixes:
            shutil.copy2(patch_dir / name, queue / name)
        (queue / "series").write_text("".join(n + "\n" for n in fixes))
        src = materialize(Path(tmp) / "fixes-src" / "src", lock_file=lock_file, patch_dir=queue,
                               cache_dir=cache_dir, quiet=True)
        touched = {f for m in mboxes for f in touched_files(m.read_text(), tree="src") if f.startswith("src/")}
        for path in sorted(touched):
            ours, theirs = src.parent / path, repo / path
            if ours.exists() != theirs.exists() or (ours.exists() and ours.read_bytes() != theirs.read_bytes()):
                raise ForkError(f"{path} after git am differs from upstream + the fix patches")
    return patch_dir


# --------------------------------------------------------------------------------------------- the document
TAG_FILES = ("src", "tests", "setup.cfg", "setup.py", "pyproject.toml", "requirements")
CHECK_RESULT = common.ROOT / "results" / "pr-series-1.8.6.json"


def _updated_tests(tests_diff: str) -> Dict[str, List[str]]:
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


def _test_names(content: str) -> List[str]:
    return re.findall(r"^(?:async )?def (test_\w+)", content, flags=re.M) + [
        f"{cls}" for cls in re.findall(r"^class (Test\w+)", content, flags=re.M)]


#: what became of each fix on upstream's current line, Lightning 2.6.6 (read in its source, measured by the 2.6.6
#: series' tests where one is named); shown in docs/upstream-prs.md
ON_CURRENT_LINE = {
    "0005-tpu-reduce-gradients-inside-the-closure.patch":
        "The Trainer reduces after its closure since 1.9.0 (#16020). Still broken in 2.6.6 and offered: Fabric's "
        "`optimizer.step(closure)` (2.6.6 series, 1) and the all-reduce lost after an in-place edit of the gradients, "
        "e.g. clipping in manual optimization (2.6.6 series, 2). Not offered: averaging before `on_after_backward` and "
        "user clipping, which changes what those hooks see and is for upstream to decide.",
    "0006-xla-mark-step-after-optimizer-step.patch":
        "Upstream has it: the Trainer since 1.9.0 (#16020); Fabric's `XLAPrecision.optimizer_step` passes "
        "`barrier=True`.",
    "0007-running-loss-on-cpu-for-xla.patch": "Not applicable: 2.x has no running loss buffer (`TensorRunningAccum`).",
    "0008-result-collection-stays-on-cpu-for-xla.patch":
        "Not applicable: 2.x keeps logged values on their device and no longer moves them to the CPU and back.",
    "0009-xla-evaluation-steps-end-with-a-barrier.patch":
        "Still missing in 2.6.6 (4470 IR nodes pending after 60 validation batches); offered as 2.6.6 series, 5.",
    "0010-defer-host-transfer-of-logged-xla-values.patch":
        "2.x logs without a host copy, but reads every progress bar value from the device two to three times a step "
        "and converts logged values one tensor at a time; offered as 2.6.6 series, 3 and 4.",
    "0011-xla-running-loss-joins-the-logged-values-transfer.patch":
        "Not applicable: 2.x has no running loss; its progress bar reads are 2.6.6 series, 3.",
    "0012-xla-logged-torchmetrics-stay-on-the-device.patch":
        "2.x keeps a logged metric on its device; its step value read twice a step on the progress bar (4 transfers "
        "with the loss) is 2.6.6 series, 3 and 4.",
    "0013-xla-bf16-converts-the-module.patch":
        "Not checked on 2.6.6, which still sets the deprecated `XLA_USE_BF16` (read once, when the runtime starts); "
        "the pattern benchmark saw bf16 in its graph.",
    "0014-xla-one-graph-per-batch-with-accumulation-and-manual-optimization.patch":
        "Still in 2.6.6 and not offered yet: after the 2.6.6 series, accumulation leaves 136 IR nodes pending per "
        "accumulating batch, and manual optimization with two optimizers runs 3 graphs a step (a barrier per "
        "`optimizer.step`), a design change in `XLAPrecision`.",
    "0015-xla-profiler-leaves-the-step-barrier-to-its-step-trace.patch":
        "Carried into 2.6.6 series, 5, which leaves the evaluation barrier to the profiler's step trace.",
    "0016-xla-interrupted-runs-leave-nothing-queued.patch":
        "Not applicable: it frees the fork's queue of deferred host copies, which 2.x does not have.",
    "0017-xla-checkpoint-keeps-callback-state.patch":
        "Not needed: 2.6.6's XLA strategies keep the `callbacks` key.",
    "0018-atomic-checkpoint-writes.patch":
        "Not checked under a kill; 2.6.6 writes checkpoints through an fsspec transaction (`_atomic_save`).",
}


def _tag_check_lines(records: Sequence[Dict], result_file: Path = CHECK_RESULT) -> List[str]:
    """What ``check-tag`` last found, if it checked the series as it is now."""
    if not result_file.exists():
        return ["_Not checked on upstream's tag yet: run `pr_series.py check-tag`._"]
    result = json.loads(result_file.read_text())
    names = [rec["mbox"].name for rec in records]
    if result.get("patches") != names:
        return ["_The last `check-tag` run checked another series; run it again._"]
    collect, ran = result.get("collect", {}), result.get("run", {})
    counted = ", ".join(f"{n} {w}" for w, n in ran.items()) if ran else "not run"
    return [
        f"Checked with `pr_series.py check-tag` on upstream's tag `1.8.6` (its `src/`, `tests/`, `setup.cfg`): "
        f"`git am` takes all {len(names)} patches; the {len(result.get('test_modules', []))} test modules they add "
        + (f"and the {len(result['updated_upstream_tests'])} upstream tests they update "
           if result.get("updated_upstream_tests") else "")
        + f"collect under upstream's pytest configuration ({'no error' if result.get('collect_ok') else 'ERRORS'}, "
        f"{sum(n for w, n in collect.items() if 'collected' in w)} tests) and, run there with the fork's compatibility "
        f"patches applied on top so that the tag imports on torch {result.get('versions', {}).get('torch', '?')}, "
        f"give: {counted}"
        + (f" (not run: {', '.join(f'`{n}`' for n in result['not_run_needs_real_tpu'])}, which need a real TPU)."
           if result.get("not_run_needs_real_tpu") else "."),
    ]


def render_doc(records: Sequence[Dict], p: Plan) -> str:
    out = [
        "# Upstream contributions",
        "",
        "<!-- generated by `make pr-series` (tools/pr_series.py) from patches/1.8.6/, patches/2.6.6/ and the tests that declare"
        " FIXED_BY; do not edit by hand -->",
        "",
        "Two series, one per upstream line, and the reports for PyTorch/XLA.",
        "",
        "- [Lightning 1.8.6](#lightning-186-the-forks-base): the fork's fixes as a `git am` series for tag `1.8.6`, "
        "for anyone maintaining 1.8.6. Upstream released nothing after 1.8.6 on the 1.8 line and takes changes on its "
        "current line only, so these are not offered as pull requests.",
        "- [Lightning 2.6.6](#lightning-266-the-current-line): one pull request per defect that the latest release "
        "still has, against upstream's current source layout.",
        "- PyTorch/XLA: two torch_xla problems found on the way, written up to be filed: "
        "[docs/upstream-bugs.md](upstream-bugs.md) (the all-reduce of `.grad.data` lost after an in-place edit of the "
        "gradients, and `xm.optimizer_step` with a closure reducing before backward).",
        "",
        "## Lightning 1.8.6 (the fork's base)",
        "",
        "The `Kind: fix` patches of `patches/1.8.6/series`, in order. `make pr-series` writes them as mbox patches to "
        "`build/pr-series/` and checks that `git am` takes them in order on the pinned 1.8.6 wheel's tree and that "
        "the result equals upstream plus the fix patches. The compatibility patches (PJRT, NumPy 2 and setuptools, "
        "torch >= 2.1) stay in the fork. Each patch's `Origin` says where it comes from (a backport names the upstream "
        "pull request) and `Forwarded` what became of it upstream.",
        "",
        *_tag_check_lines(records),
        "",
        "Apply: `git checkout -b <branch> 1.8.6 && git am build/pr-series/*.patch`.",
        "",
    ]
    if not records:
        out += ["_The series holds no fix patch yet._", ""]
    for i, rec in enumerate(records, 1):
        fix = rec["fix"]
        bug = fix.trailers.get("Bug", "none")
        src_files = [f for f in touched_files(rec["mbox"].read_text(), tree="src") if f.startswith("src/")]
        out += [
            f"### 1.8.6-{i}. {fix.subject}",
            "",
            f"- Patch: `build/pr-series/{rec['mbox'].name}` (fork patch `patches/1.8.6/{fix.name}`)",
            f"- Bug: {bug if bug != 'none' else 'no upstream issue filed'}",
            f"- Origin: {fix.trailers.get('Origin', '?')}",
            f"- Forwarded: {fix.trailers.get('Forwarded', '?')}",
            f"- On Lightning 2.6.6: {ON_CURRENT_LINE.get(fix.name, 'not examined')}",
            f"- Applies to `1.8.6` on its own: {'yes' if rec['alone'] else 'no, apply the patches before it first'}",
            "",
            "#### Description",
            "",
            fix.body.strip(),
            "",
            "#### Changes",
            "",
            *[f"- `{f}`" for f in src_files],
            "",
            "#### Tests",
            "",
        ]
        updated = _updated_tests(fix.tests_diff)
        if rec["tests"] or updated:
            for path, content in rec["tests"]:
                out.append(f"- `{path}`: " + ", ".join(f"`{t}`" for t in _test_names(content)))
            for path, names in updated.items():
                out.append(f"- `{path}` (upstream's, updated for the change of behaviour): "
                           + (", ".join(f"`{t}`" for t in names) or "see the diff"))
            out += ["", "In the fork, `make before-after` runs these tests without the patch (where they must fail, "
                    "except regression guards) and with it (where they must pass)."]
        else:
            out.append("- none yet")
        out.append("")
        changelog = fix.changelog
        out += ["#### CHANGELOG", ""] + ([f"    {line}" for line in changelog] or ["- no entry in the patch"]) + [""]
        if rec["warnings"]:
            out += ["#### Still to do", ""] + [f"- {w}" for w in rec["warnings"]] + [""]
    out += _current_line_section()
    return "\n".join(out).rstrip("\n") + "\n"


def _current_line_section() -> List[str]:
    """The section of the 2.6.6 series (``forkq.series.pr266``)."""
    from . import pr266

    return ["", pr266.render_doc_section().rstrip("\n"), ""]


TPU_ONLY_RE = re.compile(r"^@RunIf\([^)]*\btpu=True[^)]*\)\s*\n(?:@[^\n]*\n)*def (test_\w+)", re.M)


def real_tpu_tests(tests_root: Optional[Path] = None) -> List[str]:
    """The fork's tests that need real TPU hardware (``RunIf(tpu=True)`` in the fork). Exported, they carry upstream's
    ``RunIf(tpu=True)`` like every XLA test, which an XLA:CPU device satisfies, so ``check-tag`` leaves them out."""
    tests_root = common.ROOT / "tests" if tests_root is None else tests_root
    return sorted({name for root in TEST_ROOTS for path in (tests_root / root).rglob("test_*.py")
                   for name in TPU_ONLY_RE.findall(path.read_text())})


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
        tree.mkdir()
        archive = subprocess.run(["git", "-C", str(upstream_git), "archive", "1.8.6", *TAG_FILES],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise ForkError(f"{upstream_git} has no tag 1.8.6 to archive: {archive.stderr.decode(errors='replace')}")
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
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
                   for path, names in _updated_tests(Patch.read(m).tests_diff)
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
            ran = engine.run_pytest(["-q", "--color=no", "-rs", *select, *added, *updated], cwd=tree, env=env)
            result["run"] = engine.counts(engine.outcome(c) for c in ran.cases)
            result["run_ok"] = ran.returncode == 0
            if ran.returncode != 0:
                result["run_output"] = ran.output[-4000:]
        import torch

        result["versions"] = {"python": sys.version.split()[0], "torch": torch.__version__,
                              "pytest": __import__("pytest").__version__}
    if result_file is not None:
        result_file.parent.mkdir(parents=True, exist_ok=True)
        result_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pr_series.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("export", help="write the PR series and its document")
    p.add_argument("--out", type=Path, default=common.ROOT / "build" / "pr-series")
    p.add_argument("--doc", type=Path, default=common.ROOT / "docs" / "upstream-prs.md")
    p = sub.add_parser("check-tag", help="git am the series onto upstream's tag 1.8.6; collect and run its tests there")
    p.add_argument("--upstream-git", type=Path, required=True, help="a clone of upstream's repository with tag 1.8.6")
    p.add_argument("--series", type=Path, default=common.ROOT / "build" / "pr-series")
    p.add_argument("--no-run", action="store_true", help="only collect the tests")
    args = parser.parse_args(argv)
    if args.cmd == "check-tag":
        try:
            result = check_tag(args.upstream_git, args.series, run=not args.no_run)
        except ForkError as err:
            print(f"pr_series.py: error: {err}", file=sys.stderr)
            return 1
        print(json.dumps({k: v for k, v in result.items() if not k.endswith("_output")}, indent=1))
        return 0 if result["collect_ok"] and result.get("run_ok", True) else 1
    try:
        mboxes = export(args.out, args.doc)
    except ForkError as err:
        print(f"pr_series.py: error: {err}", file=sys.stderr)
        return 1
    for m in mboxes:
        print(m)
    print(f"{len(mboxes)} PR patch(es) in {args.out}; git am on upstream 1.8.6 verified; wrote {args.doc}")
    return 0
