"""Export the fork's upstream fixes (``Kind: fix`` patches) as a numbered ``git am`` series for upstream's tag 1.8.6.

Each exported patch is one pull request: the fix's source change (with the CHANGELOG entry the fix patch carries),
its updates of upstream's own tests (the patch's ``tests/`` sections, written against the tag's files, as they are),
plus the fork's test modules that declare ``FIXED_BY = "<that patch>"`` (``testmodules``). Compat patches are not
exported: a fix that only applies on top of a compat patch's changes is reported, naming the compat patch, and
nothing is written. The export verifies itself (``verify``) and writes ``docs/upstream-prs.md`` (``doc``).
"""
import email.header
import re
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ... import common
from ...common import AUTHOR, UPSTREAM_TESTS, ForkError, commit, git
from ...patchfile import Patch, merge_diffs, with_diff
from ...seriesfile import read_series
from ...upstream import read_lock
from .doc import render_doc
from .testmodules import export_helper, export_test, fix_tests, fork_helpers
from .verify import BASE_DATE, carried_test_files, excludes, upstream_repo, verify


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
                for helper in fork_helpers(test, tests_root):
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
        carried = carried_test_files(p.fixes)
        for rec in records:
            rec["alone"] = _applies_alone(repo, rec["mbox"], carried)
    verify(mboxes, patch_dir, lock_file, cache_dir)
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(render_doc(records))
    return mboxes


def _applies_alone(repo: Path, mbox: Path, carried: Sequence[str] = ()) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "wt"
        git(["worktree", "add", "-q", "--detach", str(wt), "1.8.6"], cwd=repo)
        try:
            return git(["apply", "--check", *excludes(carried), str(mbox)], cwd=wt, check=False).returncode == 0
        finally:
            git(["worktree", "remove", "--force", str(wt)], cwd=repo)


