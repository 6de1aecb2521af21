#!/usr/bin/env python3
"""Export the fork's upstream fixes (``Kind: fix`` patches) as a numbered ``git am`` series for upstream's tag 1.8.6.

Each exported patch is one pull request: the fix's source change (with the CHANGELOG entry the fix patch carries),
plus the fork's test modules that declare ``FIXED_BY = "<that patch>"``, moved to where upstream keeps them
(``tests/tests_pytorch/X.py`` -> ``tests/tests_pytorch/X.py``), with our local helper imports rewritten to upstream's
(``from helpers.runif import RunIf`` -> ``from tests_pytorch.helpers.runif import RunIf``) and the ``FIXED_BY``
constant removed. Compat patches are not exported: a fix that only applies on top of a compat patch's changes is
reported, naming the compat patch, and nothing is written.

The export verifies itself: a git repository made from the pinned upstream tree (the wheel's packages are the tag's
``src/``) takes the series with ``git am``, and every source file it touches must equal the tree materialized from
a queue holding only the fix patches.

Commands::

    pr_series.py export [--out build/pr-series] [--doc docs/upstream-prs.md]
"""
import argparse
import email.header
import email.utils
import importlib.util
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("fork_tool", HERE / "fork.py")
fork = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fork)
ForkError = fork.ForkError

TEST_ROOTS = ("tests_pytorch", "tests_lite")
FIXED_BY_RE = re.compile(r"""^FIXED_BY\s*=\s*["']([^"']+)["']\s*(#.*)?$""", re.M)
BASE_DATE = "2022-12-21T00:00:00+0000"  # the commit standing for tag 1.8.6 in the verification repository
# fork-only names that upstream's 1.8.6 test suite does not have; reported in the PR description
FORK_ONLY = {
    "xla_metrics": "the `xla_metrics` fixture is the fork's (tests/conftest.py); upstream needs an equivalent",
    "min_torch_xla": "`RunIf(min_torch_xla=...)` is the fork's; upstream's RunIf has no such argument",
}


# --------------------------------------------------------------------------------------------- discovery
def patch_info(patch: Path) -> Dict:
    info = fork.parse_patch(patch.read_text())
    info["name"] = patch.name
    info["path"] = patch
    info["kind"] = info["trailers"].get("Kind", "")
    info["files"] = touched_files(info["diff"])
    return info


def touched_files(diff: str) -> List[str]:
    seen: List[str] = []
    for a, b in re.findall(r"^diff --git a/(\S+) b/(\S+)$", diff, flags=re.M):
        for path in (a, b):
            if path not in seen:
                seen.append(path)
    return seen


def fix_tests(tests_root: Path) -> Dict[str, List[Path]]:
    """``{patch name: [test modules declaring FIXED_BY = that patch]}`` under tests_pytorch/ and tests_lite/."""
    found: Dict[str, List[Path]] = {}
    for root in TEST_ROOTS:
        for path in sorted((tests_root / root).rglob("*.py")):
            m = FIXED_BY_RE.search(path.read_text())
            if m:
                found.setdefault(m.group(1), []).append(path)
    return found


def _drop_fixed_by(text: str) -> str:
    """Remove the FIXED_BY line; when it stood between blank lines, one of them goes with it."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if FIXED_BY_RE.match(line.rstrip("\n")):
            after_blank = i + 1 < len(lines) and not lines[i + 1].strip()
            before_blank = i > 0 and not lines[i - 1].strip()
            del lines[i: i + (2 if after_blank and before_blank else 1)]
            break
    return "".join(lines)


def export_test(path: Path, tests_root: Path) -> Tuple[str, str, List[str]]:
    """(upstream path, upstream content, warnings) for one of our fix test modules."""
    rel = path.relative_to(tests_root)
    root = rel.parts[0]
    text = path.read_text()
    text = _drop_fixed_by(text)
    text = re.sub(r"^(\s*)from helpers(\.| import)", rf"\1from {root}.helpers\2", text, flags=re.M)
    text = re.sub(r"^(\s*)import helpers\.", rf"\1import {root}.helpers.", text, flags=re.M)
    # the fork's RunIf(xla=True) runs on an XLA device of any kind; upstream's 1.8.6 equivalent is tpu=True
    text = re.sub(r"(RunIf\([^)]*?)\bxla=True", r"\1tpu=True", text)
    text = re.sub(r"RunIf\(tpu=True, tpu=True", "RunIf(tpu=True", text)
    warnings = [f"{rel}: {why}" for word, why in FORK_ONLY.items() if re.search(rf"\b{word}\b", text)]
    if re.search(r"\bFIXED_BY\b", text):
        warnings.append(f"{rel}: still mentions FIXED_BY")
    return f"tests/{rel.as_posix()}", text, warnings


UPSTREAM_HELPERS = {"runif"}


def _fork_helpers(test: Path, tests_root: Path) -> List[Path]:
    """The fork's ``tests/helpers/*.py`` modules that ``test`` imports and upstream does not have."""
    names = re.findall(r"^\s*from helpers\.(\w+) import", test.read_text(), flags=re.M)
    return [tests_root / "helpers" / f"{n}.py" for n in dict.fromkeys(names) if n not in UPSTREAM_HELPERS]


def export_helper(helper: Path, test: Path, tests_root: Path) -> Tuple[str, str]:
    """(upstream path, content) of a fork helper module, placed in the helpers package of ``test``'s suite."""
    root = test.relative_to(tests_root).parts[0]
    text = re.sub(r"^(\s*)from helpers(\.| import)", rf"\1from {root}.helpers\2", helper.read_text(), flags=re.M)
    return f"tests/{root}/helpers/{helper.name}", text


# --------------------------------------------------------------------------------------------- git
def _git(args: Sequence[str], cwd: Path, check: bool = True, **kw):
    return fork._git(args, cwd=cwd, check=check, **kw)


def upstream_repo(dest: Path, lock: Dict, cache_dir: Path) -> Path:
    """A git repository holding upstream's ``src/`` at 1.8.6 in one commit tagged ``1.8.6``."""
    dest.mkdir(parents=True)
    wheel = fork.fetch_wheel("pytorch-lightning", lock["pytorch-lightning"], cache_dir)
    fork.unpack_packages(wheel, dest / "src")
    _git(["init", "-q"], cwd=dest)
    _git(["add", "-A"], cwd=dest)
    _commit(dest, "1.8.6", "upstream <upstream@localhost>", BASE_DATE)
    _git(["tag", "1.8.6"], cwd=dest)
    return dest


def _commit(repo: Path, message: str, author: str, date: str) -> None:
    name, mail = email.utils.parseaddr(author)
    _git(["-c", f"user.name={name}", "-c", f"user.email={mail}", "commit", "-q", "--allow-empty", "-F", "-",
          f"--author={name} <{mail}>", f"--date={date}"], cwd=repo, input=message)


def _decode(value: str) -> str:
    return str(email.header.make_header(email.header.decode_header(value)))


def _compat_culprits(fix: Dict, compats: Sequence[Dict]) -> List[str]:
    files = set(fix["files"])
    return [f"{c['name']} (also changes {', '.join(sorted(files & set(c['files'])))})"
            for c in compats if files & set(c["files"])]


# --------------------------------------------------------------------------------------------- export
class Plan:
    def __init__(self, fixes: List[Dict], compats: List[Dict], tests: Dict[str, List[Path]]):
        self.fixes, self.compats, self.tests = fixes, compats, tests


def plan(patch_dir: Path, tests_root: Path) -> Plan:
    infos = [patch_info(patch_dir / n) for n in fork.read_series(patch_dir / "series")]
    return Plan([i for i in infos if i["kind"] == "fix"], [i for i in infos if i["kind"] != "fix"],
                fix_tests(tests_root))


def export(out: Path, doc: Optional[Path] = None, patch_dir: Path = fork.PATCH_DIR,
           tests_root: Path = fork.ROOT / "tests", lock_file: Optional[Path] = None,
           cache_dir: Path = fork.CACHE_DIR) -> List[Path]:
    """Write the PR series to ``out`` (and the PR descriptions to ``doc``); return the mbox files."""
    out = out.resolve()  # git writes the mboxes from inside the scratch repository
    lock = fork.read_lock(lock_file)
    p = plan(patch_dir, tests_root)
    stray = sorted(set(p.tests) - {f["name"] for f in p.fixes})
    problems = [f"{', '.join(str(t) for t in p.tests[s])}: FIXED_BY names {s!r}, which is no fix patch of the series"
                for s in stray]
    records: List[Dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = upstream_repo(Path(tmp) / "upstream", lock, cache_dir)
        for fix in p.fixes:
            proc = _git(["apply", "--index", "--whitespace=nowarn", str(fix["path"])], cwd=repo, check=False)
            if proc.returncode != 0:
                culprits = _compat_culprits(fix, p.compats)
                errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
                problems.append(
                    f"{fix['name']} does not apply to upstream 1.8.6 plus the fixes before it"
                    + (f"; it depends on the context of compat patch(es): {'; '.join(culprits)}" if culprits else "")
                    + ".\n    " + "\n    ".join(errors or proc.stderr.splitlines())
                    + "\n    Rework the fix so that it does not touch lines the compat patches change (or move the "
                      "shared change into the fix) and refresh it."
                )
                continue
            tests, warnings = [], []
            if not p.tests.get(fix["name"]):
                warnings.append("no test module declares FIXED_BY for this fix: the PR has no test")
            for test in p.tests.get(fix["name"], []):
                # fork helper modules a test imports (upstream has its own `runif`) go into the first PR needing them
                for helper in _fork_helpers(test, tests_root):
                    helper_path, helper_text = export_helper(helper, test, tests_root)
                    if not (repo / helper_path).exists():
                        (repo / helper_path).parent.mkdir(parents=True, exist_ok=True)
                        (repo / helper_path).write_text(helper_text)
                        tests.append((helper_path, helper_text))
                upstream_path, content, warn = export_test(test, tests_root)
                if (repo / upstream_path).exists():
                    problems.append(f"{fix['name']}: {upstream_path} exists upstream already; rename {test}")
                (repo / upstream_path).parent.mkdir(parents=True, exist_ok=True)
                (repo / upstream_path).write_text(content)
                tests.append((upstream_path, content))
                warnings += warn
            _git(["add", "-A"], cwd=repo)
            bug = fix["trailers"].get("Bug", "none")
            message = f"{fix['subject']}\n\n{fix['body']}\n"
            if bug and bug != "none":
                message += f"\nBug: {bug}\n"
            _commit(repo, message, _decode(fix["headers"].get("From", fork.AUTHOR)),
                    fix["headers"].get("Date", BASE_DATE))
            records.append({"fix": fix, "tests": tests, "warnings": warnings})
        if problems:
            raise ForkError("the PR series cannot be exported:\n  " + "\n  ".join(problems))
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        mboxes: List[Path] = []
        if records:
            names = _git(["format-patch", "--zero-commit", "--full-index", "--no-signature", "-N", "-o", str(out),
                          "1.8.6..HEAD"], cwd=repo).stdout.split()
            for i, (name, rec) in enumerate(zip(names, records), 1):
                slug = re.sub(r"^\d{4}-", "", rec["fix"]["name"])
                target = out / f"{i:04d}-{slug}"
                Path(name).rename(target)
                mboxes.append(target)
                rec["mbox"] = target
        (out / "series").write_text("".join(m.name + "\n" for m in mboxes))
        # each PR on its own: does it apply to the bare tag, without the PRs before it?
        for rec in records:
            rec["alone"] = _applies_alone(repo, rec["mbox"])
    verify(mboxes, patch_dir, lock_file, cache_dir)
    if doc is not None:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(render_doc(records, p))
    return mboxes


def _applies_alone(repo: Path, mbox: Path) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        wt = Path(tmp) / "wt"
        _git(["worktree", "add", "-q", "--detach", str(wt), "1.8.6"], cwd=repo)
        try:
            return _git(["apply", "--check", str(mbox)], cwd=wt, check=False).returncode == 0
        finally:
            _git(["worktree", "remove", "--force", str(wt)], cwd=repo)


def verify(mboxes: Sequence[Path], patch_dir: Path = fork.PATCH_DIR, lock_file: Optional[Path] = None,
           cache_dir: Path = fork.CACHE_DIR) -> Path:
    """``git am`` the series on upstream 1.8.6 and compare each touched source file with upstream + fixes only."""
    lock = fork.read_lock(lock_file)
    fixes = [n for n in fork.read_series(patch_dir / "series")
             if patch_info(patch_dir / n)["kind"] == "fix"]
    with tempfile.TemporaryDirectory() as tmp:
        repo = upstream_repo(Path(tmp) / "upstream", lock, cache_dir)
        for mbox in mboxes:
            proc = _git(["am", "-q", "--whitespace=nowarn", str(mbox)], cwd=repo, check=False)
            if proc.returncode != 0:
                raise ForkError(f"git am {mbox.name} failed on upstream 1.8.6:\n{proc.stdout}{proc.stderr}")
        queue = Path(tmp) / "fixes-only"
        queue.mkdir()
        for name in fixes:
            shutil.copy2(patch_dir / name, queue / name)
        (queue / "series").write_text("".join(n + "\n" for n in fixes))
        src = fork.materialize(Path(tmp) / "fixes-src" / "src", lock_file=lock_file, patch_dir=queue,
                               cache_dir=cache_dir, quiet=True)
        touched = {f for m in mboxes for f in touched_files(m.read_text()) if f.startswith("src/")}
        for path in sorted(touched):
            ours, theirs = src.parent / path, repo / path
            if ours.exists() != theirs.exists() or (ours.exists() and ours.read_bytes() != theirs.read_bytes()):
                raise ForkError(f"{path} after git am differs from upstream + the fix patches")
    return patch_dir


# --------------------------------------------------------------------------------------------- the document
def _changelog_lines(diff: str) -> List[str]:
    lines, in_changelog = [], False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            in_changelog = line.endswith("CHANGELOG.md")
        elif in_changelog and line.startswith("+") and not line.startswith("+++") and line[1:].strip():
            lines.append(line[1:])
    return lines


def _test_names(content: str) -> List[str]:
    return re.findall(r"^(?:async )?def (test_\w+)", content, flags=re.M) + [
        f"{cls}" for cls in re.findall(r"^class (Test\w+)", content, flags=re.M)]


def render_doc(records: Sequence[Dict], p: Plan) -> str:
    out = [
        "# Upstream pull requests",
        "",
        "<!-- generated by `make pr-series` (tools/pr_series.py) from patches/ and the tests that declare FIXED_BY;"
        " do not edit by hand -->",
        "",
        "The fork's upstream fixes (`Kind: fix` patches of `patches/series`), one pull request each against "
        "Lightning's tag `1.8.6`. `make pr-series` writes them as mbox patches to `build/pr-series/` and checks "
        "that `git am` takes them in order on the pinned upstream tree and that the result equals upstream plus "
        "the fix patches. The compatibility patches (PJRT, modern numpy/setuptools) are fork-only and not "
        "offered upstream.",
        "",
        "Apply one: `git checkout -b <branch> 1.8.6 && git am build/pr-series/NNNN-*.patch`.",
        "",
    ]
    if not records:
        out += ["_The series holds no fix patch yet; nothing to offer upstream._", ""]
    for i, rec in enumerate(records, 1):
        fix = rec["fix"]
        bug = fix["trailers"].get("Bug", "none")
        src_files = [f for f in touched_files(rec["mbox"].read_text()) if f.startswith("src/")]
        out += [
            f"## {i}. {fix['subject']}",
            "",
            f"- Patch: `build/pr-series/{rec['mbox'].name}` (fork patch `patches/{fix['name']}`)",
            f"- Fixes: {bug if bug != 'none' else 'no upstream issue filed'}",
            f"- Forwarded: {fix['trailers'].get('Forwarded', '?')}",
            f"- Applies to `1.8.6` on its own: {'yes' if rec['alone'] else 'no, apply the PRs before it first'}",
            "",
            "### Description",
            "",
            fix["body"].strip(),
            "",
            "### Changes",
            "",
            *[f"- `{f}`" for f in src_files],
            "",
            "### Test evidence",
            "",
        ]
        if rec["tests"]:
            for path, content in rec["tests"]:
                out.append(f"- `{path}`: " + ", ".join(f"`{t}`" for t in _test_names(content)))
            out += ["", "In the fork, `make before-after` runs these tests without the patch (where they must fail) and "
                    "with it (where they must pass). Upstream runs `RunIf(tpu=True)` tests on its TPU CI only."]
        else:
            out.append("- none yet")
        out.append("")
        changelog = _changelog_lines(fix["diff"])
        out += ["### CHANGELOG", ""] + ([f"    {line}" for line in changelog] or ["- no entry in the patch"]) + [""]
        if rec["warnings"]:
            out += ["### Before opening the PR", ""] + [f"- {w}" for w in rec["warnings"]] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pr_series.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("export", help="write the PR series and its document")
    p.add_argument("--out", type=Path, default=fork.ROOT / "build" / "pr-series")
    p.add_argument("--doc", type=Path, default=fork.ROOT / "docs" / "upstream-prs.md")
    args = parser.parse_args(argv)
    try:
        mboxes = export(args.out, args.doc)
    except ForkError as err:
        print(f"pr_series.py: error: {err}", file=sys.stderr)
        return 1
    for m in mboxes:
        print(m)
    print(f"{len(mboxes)} PR patch(es) in {args.out}; git am on upstream 1.8.6 verified; wrote {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
