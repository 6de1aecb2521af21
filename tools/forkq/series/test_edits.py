"""Each edit the series makes to upstream's own tests, checked (``fork.py upstream-tests edits``,
``make upstream-test-edits``).

A patch that changes behaviour on purpose updates upstream's tests of that behaviour in its ``tests/`` sections, and a
compat patch ports them to today's pytest, torch and torchmetrics. An edit is only right if it is needed: the test as
upstream wrote it must fail on the series, and the edited test must pass there. An edit that the series passes either
way changes nothing that the series needs, and may weaken the test.

For each patch with ``tests/`` sections, the tests its hunks change are run twice on the series' source: with every
patch's test edits (the series' tests), and with every edit but that patch's (the tests "without the edit"), on the
CPU and on one XLA device. A hunk inside a test function names that test; a hunk of a test module outside any test
(an import, a module mark) names the whole module; a hunk of a helper (``helpers/utils.py``) names the tests that
call what it changes.
"""
import ast
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .. import common, stamp
from ..common import ForkError
from ..patchfile import Patch, file_sections
from ..seriesfile import read_series
from ..upstream import TAG, TAG_TEST_FILES
from . import upstream_tests as ut

BUILD = common.ROOT / "build" / "upstream-test-edits"
RESULT = common.ROOT / "results" / f"upstream-test-edits-{TAG}.json"
MODES = ("cpu", "xla")
#: the most tests that stand for one edited helper (the first, by path and name)
HELPER_TESTS = 12

VERDICTS = {
    "needed": "fails on the series as upstream wrote it, passes as edited",
    "not needed": "passes on the series as upstream wrote it: the edit changes nothing the series needs",
    "edited fails": "passes on the series as upstream wrote it and fails as edited: the edit breaks it",
    "fails either way": "fails on the series with and without the edit, for a reason of its own (see both_fail.txt)",
    "not run here": "every test it names skips here (a GPU, several devices, a package not installed)",
    "needed elsewhere": "passes here as upstream wrote it; its need shows on hardware or timing this host lacks "
                        "(reviewed: NEEDED_ELSEWHERE)",
}


def changed_definitions(section: str, source: Optional[str] = None) -> List[str]:
    """The functions and classes whose lines a diff section changes, in order; ``"*"`` for a change outside any.

    A changed line belongs to the definition named on an earlier line of its hunk, or in the hunk's header; a changed
    decorator or comment at the top level belongs to the definition below it, another top-level statement to the
    module. Where that definition is not in the hunk (a decorator above a long ``parametrize``), ``source`` (the
    module as the diff's old side has it) names it."""
    definition = re.compile(r"^(?:async )?(?:def|class) (\w+)")
    old_lines = source.splitlines() if source is not None else []
    names: List[str] = []
    for hunk in re.split(r"(?m)^(?=@@ )", section)[1:]:
        lines = hunk.splitlines()
        named = re.search(r"\b(?:def|class) (\w+)", lines[0].split("@@")[-1])
        current: Optional[str] = named.group(1) if named else None
        start = re.match(r"@@ -(\d+)", lines[0])
        old_line = int(start.group(1)) if start else 0  # the old side's number of the next line that has one
        for i, line in enumerate(lines[1:], start=1):
            found = re.match(r"^[-+ ](?:async )?(?:def|class) (\w+)", line)
            if found:
                current = found.group(1)
            at = old_line
            if line[:1] in " -":
                old_line += 1
            if line[:1] not in "+-" or not line[1:].strip():
                continue
            name = current or "*"
            if line[1:2] in ("@", "#"):
                below = next((re.match(r"^[-+ ](?:async )?(?:def|class) (\w+)", later) for later in lines[i + 1:]
                              if re.match(r"^[-+ ](?:async )?(?:def|class) ", later)), None)
                if below:
                    name = below.group(1)
                else:
                    below_in_source = next((definition.match(text) for text in old_lines[at - 1:]
                                            if definition.match(text)), None)
                    name = below_in_source.group(1) if below_in_source else name
            elif not found and not line[1:2].isspace():
                name = "*"  # a statement of the module itself (a constant the tests share)
            if name not in names:
                names.append(name)
    return names


def _test_nodes(module: Path, rel: str) -> Dict[str, str]:
    """``{test function: node id}`` of a test module (``Class::test`` for methods)."""
    tree = ast.parse(module.read_text())
    nodes = {}
    for item in tree.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
            nodes[item.name] = f"{rel}::{item.name}"
        elif isinstance(item, ast.ClassDef) and item.name.startswith("Test"):
            for sub in item.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name.startswith("test"):
                    nodes.setdefault(sub.name, f"{rel}::{item.name}::{sub.name}")
    return nodes


def _callers(tests_root: Path, modules: Sequence[Path], names: Sequence[str], limit: int = HELPER_TESTS) -> List[str]:
    """Node ids of the first ``limit`` tests of ``modules`` whose own code names one of ``names``."""
    found: List[str] = []
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    for module in modules:
        source = module.read_text()
        if not pattern.search(source):
            continue
        nodes = _test_nodes(module, module.relative_to(tests_root).as_posix())
        for item in ast.walk(ast.parse(source)):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in nodes:
                if pattern.search(ast.get_source_segment(source, item) or "") and nodes[item.name] not in found:
                    found.append(nodes[item.name])
        if len(found) >= limit:
            break
    return found[:limit]


def edits(tests_root: Path, names: Optional[Sequence[str]] = None, patch_dir: Path = common.PATCH_DIR) -> List[Dict]:
    """The edits of the series' ``tests/`` sections: ``{"patch", "file", "test", "nodes"}`` each, ``test`` being the
    edited test function, ``*`` for a change of a test module outside any definition (the whole module stands for
    it), or ``helper <names>`` for changed functions or classes that are no tests (the tests that name them stand
    for them: in the same module, or for a helper module, under the same ``tests/<top>``)."""
    out = []
    for name in names if names is not None else read_series(patch_dir / "series"):
        tests_diff = Patch.read(patch_dir / name).tests_diff
        for path, section in file_sections(tests_diff):
            module = tests_root / path
            changed = changed_definitions(section, module.read_text() if module.is_file() else None)
            helpers = [n for n in changed if n != "*" and not n.startswith(("test", "Test"))]
            if Path(path).name.startswith("test_"):
                nodes = _test_nodes(module, path)
                for function in [n for n in changed if n.startswith("test")]:
                    out.append({"patch": name, "file": path, "test": function, "nodes": [nodes[function]]})
                if "*" in changed:
                    out.append({"patch": name, "file": path, "test": "*", "nodes": [path]})
                modules = [module]
            else:
                # the tests of other hardware (GPU, HPU, IPU) last: they skip here
                modules = sorted((tests_root / "tests" / path.split("/")[1]).rglob("test_*.py"),
                                 key=lambda m: (bool(re.search(r"[ghi]pu", m.name)), m.as_posix()))
            if helpers:
                out.append({"patch": name, "file": path, "test": "helper " + ", ".join(helpers),
                            "nodes": _callers(tests_root, modules, helpers)})
    return out


def build_without(name: str, tests_root: Path, series: Path, dest: Path, patch_dir: Path = common.PATCH_DIR) -> Path:
    """``dest``: the series' source (a link to ``series/src``) with upstream's tests edited by every patch but
    ``name``."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / "src").symlink_to((series / "src").resolve(), target_is_directory=True)
    for file in TAG_TEST_FILES:
        if (tests_root / file).is_dir():
            shutil.copytree(tests_root / file, dest / file)
        elif (tests_root / file).exists():
            shutil.copy2(tests_root / file, dest / file)
    others = [n for n in read_series(patch_dir / "series") if n != name]
    try:
        ut.apply_test_updates(dest, others, patch_dir)
    except ForkError as err:
        raise ForkError(f"upstream's tests with every edit but those of {name} cannot be made: a later patch edits "
                        f"the same lines ({err})") from err
    return dest


def _run(tree: Path, nodes: Sequence[str], mode: str, name: str, test_timeout: float, timeout: float,
         workers: int) -> Dict[str, Dict[str, str]]:
    """The outcomes of ``nodes`` in ``tree`` (pytest's JUnit keys), on the CPU or on XLA. A module that does not load
    (upstream's test of an API that changed) stands as one error under the module's name: its tests are not named
    to pytest, which would refuse the whole run ("found no collectors")."""
    if not nodes:
        return {}
    files = sorted({node.split("::")[0] for node in nodes})
    _checked(ut._pytest(tree, ["--collect-only", *files], f"{name}-collect", test_timeout, timeout, xla=mode == "xla"),
             tree, f"{name}-collect", mode, allowed=(0, 1, 2))
    broken = {key: entry for key, entry in ut.read_outcomes(tree / f"{name}-collect.xml").items() if "::" not in key}
    loading = [n for n in nodes if n.split("::")[0][: -len(".py")].replace("/", ".") not in broken]
    outcomes = dict(broken)
    if loading:
        _checked(ut._pytest(tree, loading, name, test_timeout, timeout, xla=mode == "xla", workers=workers), tree,
                 name, mode)
        outcomes.update(ut.read_outcomes(tree / f"{name}.xml"))
    return outcomes


def _checked(run: Dict, tree: Path, name: str, mode: str, allowed: Sequence[int] = (0, 1)) -> Dict:
    """``run``, unless pytest ended early or for a reason of its own (a usage error, an internal error); exit code 2
    (modules that did not load) only where ``allowed`` names it."""
    if run["timed_out"] or run["exit_code"] not in allowed or (run["aborted"] and run["exit_code"] != 2):
        raise ForkError(f"pytest ended early on {tree.name} ({mode}, exit code {run['exit_code']}): see "
                        f"{tree / (name + '.log')}")
    return run


#: edits whose need this host cannot show, each with why (reviewed): their verdict is "needed elsewhere" where the
#: series passes them without the edit here, and they are checked as any other edit where it fails
NEEDED_ELSEWHERE = {
    ("0006-xla-mark-step-after-optimizer-step.patch", "tests/tests_pytorch/callbacks/test_timer.py",
     "test_timer_stops_training"):
        "upstream's 1-second budget ends inside the first step's compilation where it takes longer (a TPU host, a "
        "cold cache, a loaded CI machine): failed on this host on 2026-12-03, passed on 2026-12-05",
    ("0008-result-collection-stays-on-cpu-for-xla.patch",
     "tests/tests_pytorch/trainer/logging_/test_eval_loop_logging.py", "test_eval_logging_auto_reduce"):
        "the logged values are reduced on the CPU and the test's own mean on the device: the two can differ in the "
        "last bit, which depends on the values (on XLA:CPU: needed in one run of 2026-12-05, not in the other)",
}


def _of(edit: Dict, outcomes: Dict[str, Dict[str, str]]) -> Dict[str, str]:
    """``{JUnit key: outcome}`` of the tests an edit names (every parametrization of each); a module of them that
    failed to load stands as one failing test under the module's name."""
    found = {}
    for node in edit["nodes"]:
        file, *rest = node.split("::")
        module = file[: -len(".py")].replace("/", ".")
        classname = ".".join([module, *rest[:-1]])
        for key, entry in sorted(outcomes.items()):
            if key == module:  # the module did not load
                found[key] = entry["outcome"]
            elif entry["file"] == file and (not rest or (key.startswith(classname + "::")
                                                         and ut._function(key) == rest[-1])):
                found[key] = entry["outcome"]
    return found


def mode_verdict(edited: Dict[str, str], unedited: Dict[str, str]) -> str:
    """What one mode says of an edit, test by test, from the outcomes of its tests as edited and as upstream wrote
    them (a module that did not load as upstream wrote it fails each of its tests)."""
    failing = set(ut.FAILING)
    module_failed = [o for k, o in unedited.items() if "::" not in k and o in failing]
    pairs = []
    for key, after in edited.items():
        before = unedited.get(key, module_failed[0] if module_failed else None)
        # a test that fails as expected (xfail) with and without the edit fails whatever made it fail: it shows
        # nothing of the edit
        if after == "skipped" or before is None or after == before == "xfailed":
            continue
        pairs.append((before in failing, after in failing))
    if not pairs:
        return "not run here"
    if any(not before and after for before, after in pairs):
        return "edited fails"
    if any(before and not after for before, after in pairs):
        return "needed"
    if any(not before and not after for before, after in pairs):
        return "not needed"
    return "fails either way"


def verdict(per_mode: Dict[str, str]) -> str:
    """One edit's verdict over the modes: needed where it is needed in some mode and breaks nothing in any."""
    values = set(per_mode.values())
    for name in ("edited fails", "needed", "not needed", "fails either way"):
        if name in values:
            return name
    return "not run here"


def check(upstream: Path, modes: Sequence[str] = MODES, build: Path = BUILD, out: Path = RESULT,
          test_timeout: float = 300.0, timeout: float = 3600.0, workers: int = 2, log=print,
          patch_dir: Path = common.PATCH_DIR) -> Dict:
    """Run every edit's tests as edited and without the edit, in ``modes``; write the verdicts to ``out``."""
    build = build.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        tests_root = Path(tmp) / "upstream"
        source = ut.extract_tests(upstream, tests_root)
        series = ut.build_tree("series", tests_root, build, patch_dir)
        found = edits(tests_root, patch_dir=patch_dir)
        order = read_series(patch_dir / "series")
        patches = sorted({e["patch"] for e in found}, key=order.index)
        without = {name: build_without(name, tests_root, series, build / f"without-{name[:-len('.patch')]}",
                                       patch_dir) for name in patches}
    nodes = sorted({n for e in found for n in e["nodes"]})
    runs: Dict[str, Dict[str, Dict]] = {mode: {} for mode in modes}
    for mode in modes:
        log(f"{mode}: {len(nodes)} tests of {len(found)} edits as edited")
        runs[mode]["series"] = _run(series, nodes, mode, f"edits-{mode}", test_timeout, timeout, workers)
        for name, tree in without.items():
            mine = sorted({n for e in found if e["patch"] == name for n in e["nodes"]})
            log(f"{mode}: {len(mine)} tests without the edits of {name}")
            # without pytest-xdist: a module that does not load as upstream wrote it stops an xdist session
            runs[mode][name] = _run(tree, mine, mode, f"edits-{mode}", test_timeout, timeout, 0)
    results = []
    for edit in found:
        per_mode = {}
        outcomes = {}
        for mode in modes:
            edited, unedited = _of(edit, runs[mode]["series"]), _of(edit, runs[mode][edit["patch"]])
            per_mode[mode] = mode_verdict(edited, unedited)
            outcomes[mode] = {"edited": _count(list(edited.values())), "unedited": _count(list(unedited.values()))}
        found_verdict = verdict(per_mode)
        why = NEEDED_ELSEWHERE.get((edit["patch"], edit["file"], edit["test"]))
        if found_verdict == "not needed" and why:
            found_verdict = "needed elsewhere"
        results.append({**edit, "modes": per_mode, "outcomes": outcomes, "verdict": found_verdict,
                        **({"needed_elsewhere": why} if why else {})})
    result = {"tag": TAG, "upstream_tests": source, "modes": list(modes), "verdicts": VERDICTS,
              "counts": _count([r["verdict"] for r in results]), "edits": results, "versions": ut._versions()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"stamp": stamp.make(tree="the series and the series without each patch's test edits"),
                               **result}, indent=1) + "\n")
    return result


def _count(values: Sequence[str]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


def problems(result: Dict) -> List[str]:
    """The edits that are not shown needed: one that the series passes without, one that fails as edited."""
    return [f"{e['patch']}: {e['file']}::{e['test']}: {e['verdict']} ({VERDICTS[e['verdict']]}; "
            + ", ".join(f"{m} {v}" for m, v in e["modes"].items()) + ")"
            for e in result["edits"] if e["verdict"] in ("not needed", "edited fails")]


def summary(result: Dict) -> str:
    lines = [f"edits of upstream's tests: {len(result['edits'])}, "
             + ", ".join(f"{v} {n}" for v, n in result["counts"].items())]
    for e in result["edits"]:
        lines.append(f"  {e['verdict']:>12}  {e['patch'][:-len('.patch')]}: {e['file']}::{e['test']} "
                     f"({', '.join(f'{m} {v}' for m, v in e['modes'].items())})")
    return "\n".join(lines)
