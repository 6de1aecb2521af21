"""The fork's fixes for Lightning's current line, 2.6.6: a ``git am`` series against upstream's source layout.

The patches live in ``patches/2.6.6/`` and are listed in order in ``patches/2.6.6/series`` (``#`` comments allowed).
Each one is a ``git format-patch`` mbox whose message is the pull request description and whose diff touches
upstream's paths: ``src/lightning/fabric/...``, ``src/lightning/pytorch/...`` and the tests it adds under
``tests/tests_fabric/...`` or ``tests/tests_pytorch/...``.

The base is the pinned wheel ``lightning-2.6.6-py3-none-any.whl`` (entry ``lightning-2.6.6`` of ``upstream.lock``,
downloaded with pip into ``.cache/upstream/`` and refused on a sha256 mismatch): its ``lightning/`` package is
upstream's ``src/lightning/`` tree. The wheel has no ``tests/`` tree, so every patch's tests are self-contained.

Commands (``python3 tools/fork.py pr-series-266 ...``)::

    tree   [--dest build/lightning-2.6.6]        git repository: the wheel's tree, tagged 2.6.6
    export [--out build/pr-series-2.6.6]         git am check, numbered copy of the series
    verify [--only NAME] [--json patches/2.6.6/verified.json]

``verify`` runs, for each patch, the tests that the patch adds (``def test_*`` lines added by its diff) on the tree
holding the patches before it, where each of them must fail, and again after ``git am`` of the patch, where each must
pass, on XLA:CPU (``PJRT_DEVICE=CPU``, ``PYTHONPATH=<tree>/src:<tree>/tests``). A skipped test proves nothing and
counts as a missing flip. The outcome is written to the JSON file; the exit status is 1 when a flip is missing.
``render_doc_section()`` turns the series and that file into the "Lightning 2.6.6" section of docs/upstream-prs.md.
"""
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .. import common
from ..common import ForkError, git, match_patch, seconds_from_env
from ..patchfile import Patch, added_tests, touched_files
from ..rules import PR_TEST_ROOTS, queue_problems
from ..seriesfile import read_series as read_series_file
from ..upstream import LOCK_KEYS, fetch_wheel, lock_entry, unpack_packages
from . import engine

ROOT = common.ROOT
LOCK_KEY = LOCK_KEYS["2.6.6"]
TAG = "2.6.6"
PACKAGE = "lightning"
PATCH_DIR = common.PATCH_DIR_266
VERIFIED_JSON = PATCH_DIR / "verified.json"
CACHE_DIR = common.CACHE_DIR
TREE_DIR = ROOT / "build" / "lightning-2.6.6"
OUT_DIR = ROOT / "build" / "pr-series-2.6.6"
BASE_AUTHOR = "upstream <upstream@localhost>"
BASE_DATE = "2026-09-10T00:00:00+0000"  # the 2.6.6 entry of upstream's CHANGELOG
TEST_TIMEOUT_ENV, TEST_TIMEOUT_DEFAULT = "PR_SERIES_TEST_TIMEOUT", 1200.0
TEST_ROOTS = PR_TEST_ROOTS
# what a test prints about the update it measured (ratio of the applied to the expected update, distances)
MEASURE_RE = re.compile(r"ratio|max \|", re.I)


# --------------------------------------------------------------------------------------------- the series
def read_series(patch_dir: Path = PATCH_DIR) -> List[str]:
    return read_series_file(patch_dir / "series")


def check_series(patch_dir: Path = PATCH_DIR) -> List[str]:
    """Problems of the series as a whole: every listed patch well-formed, nothing unlisted, no name twice, the
    comment lines current."""
    return queue_problems("2.6.6", patch_dir)


# --------------------------------------------------------------------------------------------- git trees
def base_tree(dest: Path, lock_file: Optional[Path] = None, cache_dir: Path = CACHE_DIR) -> Path:
    """A new git repository at ``dest``: the wheel's ``lightning/`` as ``src/lightning/``, one commit tagged 2.6.6."""
    if dest.exists():
        raise ForkError(f"{dest} exists; remove it or pick another --dest")
    wheel = fetch_wheel(PACKAGE, lock_entry(LOCK_KEY, lock_file), cache_dir)
    dest.mkdir(parents=True)
    unpack_packages(wheel, dest / "src", packages=(PACKAGE,))
    git(["init", "-q"], cwd=dest)
    git(["add", "-A"], cwd=dest)
    git(["commit", "-q", f"--author={BASE_AUTHOR}", f"--date={BASE_DATE}", "-m",
          f"lightning {TAG} (the {wheel.name} wheel's lightning/ package)"], cwd=dest)
    git(["tag", TAG], cwd=dest)
    return dest


def git_am(tree: Path, patch: Path) -> None:
    proc = git(["am", "-q", str(patch)], cwd=tree, check=False)
    if proc.returncode != 0:
        git(["am", "--abort"], cwd=tree, check=False)
        raise ForkError(f"git am {patch.name} failed on {TAG} plus the patches before it:\n{proc.stdout}{proc.stderr}")


# --------------------------------------------------------------------------------------------- export
def export(out: Path = OUT_DIR, patch_dir: Path = PATCH_DIR, lock_file: Optional[Path] = None,
           cache_dir: Path = CACHE_DIR) -> List[Path]:
    """``git am`` every patch in order on the pinned tree, then copy the series to ``out`` as 0001-..., 0002-..."""
    problems = check_series(patch_dir)
    if problems:
        raise ForkError("the 2.6.6 series is not well-formed:\n  " + "\n  ".join(problems))
    names = read_series(patch_dir)
    with tempfile.TemporaryDirectory() as tmp:
        tree = base_tree(Path(tmp) / "lightning", lock_file, cache_dir)
        for name in names:
            git_am(tree, patch_dir / name)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    written = []
    for i, name in enumerate(names, 1):
        target = out / f"{i:04d}-{re.sub(r'^[0-9]{4}-', '', name)}"
        shutil.copy2(patch_dir / name, target)
        written.append(target)
    (out / "series").write_text("".join(p.name + "\n" for p in written))
    return written


# --------------------------------------------------------------------------------------------- verify
def _versions(python: str) -> Dict[str, str]:
    code = ("import json, platform, torch, torch_xla; print(json.dumps({'python': platform.python_version(), "
            "'torch': torch.__version__, 'torch_xla': torch_xla.__version__}))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ForkError(f"{python} cannot import torch and torch_xla:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_tests(tree: Path, nodes: Sequence[str], python: str = sys.executable,
              timeout: Optional[float] = None) -> Dict:
    """Run ``nodes`` in ``tree`` on XLA:CPU; per-test outcomes, counts and the measurements the tests print."""
    timeout = seconds_from_env(TEST_TIMEOUT_ENV, TEST_TIMEOUT_DEFAULT) if timeout is None else timeout
    env = dict(os.environ)
    env["PJRT_DEVICE"] = "CPU"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(tree / "src"), str(tree / "tests")])
    env.pop("PYTEST_ADDOPTS", None)
    args = ["--import-mode=importlib", "-q", "-rA", "-o", "junit_logging=system-out", "-o", "junit_family=xunit1",
            "--rootdir", str(tree), *nodes]
    run = engine.run_pytest(args, cwd=tree, env=env, python=python, timeout=timeout)
    returncode, tail = (None if run.timed_out else run.returncode), run.tail
    tests: Dict[str, Dict] = {}
    for case in run.cases:
        path = case["file"] or case["classname"].replace(".", "/") + ".py"
        measured = [line.strip() for line in case["stdout"].splitlines() if MEASURE_RE.search(line)]
        tests[f"{path}::{case['name']}"] = {"outcome": case["outcome"], "measured": measured}
    counts = {k: sum(1 for t in tests.values() if t["outcome"] == k) for k in engine.OUTCOMES}
    result = {"returncode": returncode, **counts, "tests": tests}
    if returncode not in (0, 1) or not tests:
        # pytest crashed, timed out or collected nothing: keep the end of its output
        result["output_tail"] = tail
    return result


def verify(only: Optional[str] = None, json_path: Path = VERIFIED_JSON, patch_dir: Path = PATCH_DIR,
           lock_file: Optional[Path] = None, cache_dir: Path = CACHE_DIR, python: str = sys.executable,
           log=print) -> Dict:
    """Each patch's added tests must fail on 2.6.6 plus the patches before it and pass with the patch.

    The outcome is written to ``json_path``; with ``only``, that patch's record replaces its old one."""
    problems = check_series(patch_dir)
    if problems:
        raise ForkError("the 2.6.6 series is not well-formed:\n  " + "\n  ".join(problems))
    names = read_series(patch_dir)
    if only is not None:
        match = match_patch(names, only)
        if match is None:
            raise ForkError(f"--only {only!r} names no single patch of {', '.join(names)}")
        only = match
    entry = lock_entry(LOCK_KEY, lock_file)
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        "upstream": {"wheel": entry["filename"], "sha256": entry["sha256"]},
        "versions": _versions(python),
        "device": "PJRT_DEVICE=CPU",
        "patches": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        tree = base_tree(Path(tmp) / "lightning", lock_file, cache_dir)
        for name in names:
            patch = patch_dir / name
            if only is not None and name != only:
                git_am(tree, patch)
                continue
            text = patch.read_text()
            nodes = added_tests(text)
            sources = [f for f in touched_files(text) if not f.startswith(TEST_ROOTS)]
            git_am(tree, patch)
            # the patch's tests on the code before it: its non-test files as they were before it
            _checkout(tree, sources, "HEAD~1")
            log(f"{name}: {len(nodes)} test(s) without the patch ...", flush=True)
            before = run_tests(tree, nodes, python)
            _checkout(tree, sources, "HEAD")
            log(f"{name}: ... and with it", flush=True)
            after = run_tests(tree, nodes, python)
            # a node id selects every parametrization of a test: judge every collected case
            cases = sorted(set(before["tests"]) | set(after["tests"]), key=_case_order(nodes))
            flip = {c: (before["tests"].get(c, {}).get("outcome", "missing"),
                        after["tests"].get(c, {}).get("outcome", "missing")) for c in cases}
            ok = bool(cases) and all(engine.flipped(b, a) for b, a in flip.values())
            ok = ok and all(any(c == n or c.startswith(n + "[") for c in cases) for n in nodes)
            record["patches"].append({
                "name": name,
                "subject": Patch(text, patch).subject,
                "tests": nodes,
                "before": before,
                "after": after,
                "flipped": ok,
                "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
                "versions": record["versions"],
            })
            log(f"{name}: before {_counts(before)}; after {_counts(after)}; "
                f"{'fails without, passes with the patch' if ok else 'FLIP MISSING'}", flush=True)
            for case, (b, a) in flip.items():
                log(f"  {case}: {b} -> {a}", flush=True)
    if only is not None and json_path.exists():
        # one patch re-verified: keep the others' records
        old = json.loads(json_path.read_text())
        kept = [p for p in old.get("patches", []) if p["name"] in names and p["name"] != only]
        record["patches"] = sorted(kept + record["patches"], key=lambda p: names.index(p["name"]))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(record, indent=1, sort_keys=False) + "\n")
    return record


def _checkout(tree: Path, files: Sequence[str], rev: str) -> None:
    """Set ``files`` in the work tree of ``tree`` to their content at ``rev`` (absent there: removed)."""
    for f in files:
        if git(["cat-file", "-e", f"{rev}:{f}"], cwd=tree, check=False).returncode == 0:
            git(["checkout", rev, "--", f], cwd=tree)
        elif (tree / f).exists():
            (tree / f).unlink()
    if rev == "HEAD":
        status = git(["status", "--porcelain", "--untracked-files=no"], cwd=tree).stdout.strip()
        if status:
            raise ForkError(f"the tree is not back at the patch after the run without it:\n{status}")


def _case_order(nodes: Sequence[str]):
    def key(case: str):
        base = case.split("[", 1)[0]
        return (nodes.index(base) if base in nodes else len(nodes), case)
    return key


def _counts(result: Dict) -> str:
    parts = [f"{result[k]} {k}" for k in ("passed", "failed", "error", "skipped") if result.get(k)]
    return ", ".join(parts) or f"nothing ran (pytest exit {result.get('returncode')})"


# --------------------------------------------------------------------------------------------- the document
SECTION_LABELS = ("What was wrong", "The fix", "How it was tested")


def _sections(body: str) -> Dict[str, str]:
    """``{label: text}`` of a message divided by the lines ``What was wrong:``, ``The fix:``, ``How it was tested:``."""
    labels = "|".join(re.escape(label) for label in SECTION_LABELS)
    parts = re.split(rf"^({labels}):[ \t]*$", body, flags=re.M)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _cell(test: Optional[Dict]) -> str:
    if not test:
        return "not run"
    measured = "; ".join(test.get("measured", []))
    text = f"{test['outcome']} ({measured})" if measured else test["outcome"]
    return text.replace("|", "\\|")


def render_doc_section(patch_dir: Path = PATCH_DIR, json_path: Path = VERIFIED_JSON) -> str:
    """Markdown for docs/upstream-prs.md: the 2.6.6 series, per patch its defect, files, tests and verification."""
    names = read_series(patch_dir)
    verified = json.loads(json_path.read_text()) if json_path.exists() else {"patches": []}
    by_name = {p["name"]: p for p in verified.get("patches", [])}
    versions = verified.get("versions", {})
    out = [
        "## Lightning 2.6.6 (the current line)",
        "",
        "Fixes for defects that Lightning's latest release, 2.6.6, still has, one pull request each against "
        "upstream's source layout (`src/lightning/fabric`, `src/lightning/pytorch`, tests under `tests/tests_fabric` "
        "and `tests/tests_pytorch`). The series is `patches/2.6.6/series`; the base is the pinned wheel "
        "`lightning-2.6.6-py3-none-any.whl` (sha256 in `upstream.lock`), whose `lightning/` package is upstream's "
        "`src/lightning/` tree.",
        "",
        "- `python3 tools/fork.py pr-series-266 export` checks that `git am` takes the series in order and writes it "
        "to `build/pr-series-2.6.6/`; `fork.py pr-series-266 tree` writes the base repository (tag `2.6.6`).",
        "- `fork.py pr-series-266 verify` runs the tests each patch adds on XLA:CPU (`PJRT_DEVICE=CPU`), on 2.6.6 "
        "plus the patches before it (each must fail) and after `git am` of the patch (each must pass), and records "
        "the outcome in `patches/2.6.6/verified.json`.",
        "- The CHANGELOG entries end without a link: no upstream issue about these defects was found, and the pull "
        "request number is added once the pull request is opened.",
        "",
    ]
    if verified.get("date"):
        out += [f"Last verification: {verified['date']}, torch {versions.get('torch', '?')}, "
                f"torch_xla {versions.get('torch_xla', '?')}, Python {versions.get('python', '?')}, "
                f"{verified.get('device', '')}.", ""]
    if not names:
        out += ["_The series holds no patch yet._", ""]
    for i, name in enumerate(names, 1):
        patch = Patch.read(patch_dir / name)
        sections = _sections(patch.body)
        defect = sections.get("What was wrong") or patch.body.split("\n\n", 1)[0]
        fix = sections.get("The fix", "")
        files = patch.files
        out += [f"### {i}. {patch.subject}", "", f"Patch: `patches/2.6.6/{name}`", "", "**Defect.** " + defect, ""]
        if fix:
            out += ["**Fix.** " + fix, ""]
        out += ["**Files.**", ""] + [f"- `{f}`" for f in files] + [""]
        out += ["**Tests** (added by the patch):", ""] + [f"- `{n}`" for n in added_tests(patch.diff)] + [""]
        rec = by_name.get(name)
        if rec is None:
            out += ["**Verified:** not yet (`fork.py pr-series-266 verify`).", ""]
        else:
            when = rec.get("date", verified.get("date", "?"))
            v = rec.get("versions", versions)
            verdict = "each test fails without the patch and passes with it" if rec["flipped"] else "FLIP MISSING"
            out += [f"**Verified** ({verdict}; {when}, torch {v.get('torch', '?')}, "
                    f"torch_xla {v.get('torch_xla', '?')}, XLA:CPU): without the patch {_counts(rec['before'])}; "
                    f"with it {_counts(rec['after'])}.", ""]
            out += ["| test | without the patch | with the patch |", "|---|---|---|"]
            cases = sorted(set(rec["before"]["tests"]) | set(rec["after"]["tests"]), key=_case_order(rec["tests"]))
            for case in cases:
                cells = [_cell(rec["before"]["tests"].get(case)), _cell(rec["after"]["tests"].get(case))]
                suite = next((r.split("/")[1] for r in TEST_ROOTS if case.startswith(r)), "")
                out.append(f"| {suite} `{case.split('::', 1)[-1]}` | {cells[0]} | {cells[1]} |")
            out.append("")
        changelog = patch.changelog
        if changelog:
            out += ["**CHANGELOG.**", ""] + [f"    {line}" for line in changelog] + [""]
    return "\n".join(out).rstrip("\n") + "\n"
