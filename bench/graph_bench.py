#!/usr/bin/env python3
"""The graph benchmark: what one training step costs on an XLA device, row by row.

Every row trains the same model on the same synthetic data with the same optimizer, in its own process, and
reports for the steady state (after the warm-up steps): graphs compiled, graphs executed and device-to-host
transfers per step (``torch_xla.debug.metrics``), seconds per step and drift (mean time of the last ten steady
steps over the first ten). Every row also gets a time ratio against a reference measured in the same process,
under the same machine load: after every 10 steps of the row, 10 steps of the hand-written PT/XLA loop run, and the
row's time is reported over theirs (see PairedReference in bench_rows.py); a row that cannot be paired (work left
pending on the device between steps, or too few steps) is compared with hand-loop runs made around it.

Rows (``--rows``, comma separated; default all):
    before          upstream 1.8.6 + the compat patches only (the series up to the first fix)
    fix-NNNN        one row per ``Kind: fix`` patch of patches/1.8.6/series: the series up to and including it
    fork            the whole series (merged with the last fix row when the series ends with a fix)
    lite            LightningLite of the fork, accelerator="tpu", devices=1
    pl266           the latest upstream release, pytorch-lightning 2.6.6, in build/bench/pl266
    xla-loop        the hand-written PT/XLA loop (reads the loss after the barrier, as the progress bar does)
    xla-loop-noread the hand-written PT/XLA loop that never reads the loss
    cpu-lightning   the fork's Trainer on accelerator="cpu"
    cpu-loop        the hand-written loop on the CPU
    none            no row of the main tables (only the pattern table)

Pattern table (``--patterns``, comma separated keys of bench/patterns.py, ``all`` or ``none``; by default all when
``--rows`` is all or none, none when ``--rows`` names rows): everyday
patterns (a logged torchmetrics metric, accumulation, manual optimization, bf16, sync_dist, a validation loop), each
run by the fork, by Lightning 2.6.6 and as a hand-written PT/XLA loop (``--pattern-columns``), counted per step (per
batch, per validation batch) and paired with the pattern's own hand-written loop.

Usage::

    PJRT_DEVICE=CPU python bench/graph_bench.py [--quick] [--rows xla-loop,fork] [--sizes small]
                                               [--steps 200,60] [--warmup 30,10] [--out results]

Writes ``results/bench.md``, ``results/bench.json`` and ``results/bench.png``; exits non-zero when a row crashed.
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = ROOT / "build" / "bench"
PL266_VERSION = "2.6.6"
SIZE_NAMES = ("small", "heavy")
SIZE_TITLES = {
    "small": "small MLP 64-128-10, batch 32 (overhead dominates)",
    "heavy": "wide MLP 512-1024-1024-10, batch 128 (compute dominates)",
}

os.environ.setdefault(
    "PJRT_DEVICE", "TPU" if os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0") else "CPU")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sys.path.insert(0, str(ROOT / "tools"))
from forkq import common as fork_common, patchfile as fork_patches  # noqa: E402
bench_rows = _load("bench_rows", HERE / "bench_rows.py")


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------------------------- rows
class Row:
    """One line of the table: ``kind`` is what bench_rows.py runs, ``upto`` the fork tree (the series up to that
    patch) it imports, ``pl266`` whether it imports Lightning 2.6.6 instead."""

    def __init__(self, key: str, label: str, kind: str, upto: Optional[str] = None, pl266: bool = False,
                 pattern: Optional[str] = None, column: Optional[str] = None):
        self.key, self.label, self.kind, self.upto, self.pl266 = key, label, kind, upto, pl266
        # pattern rows (kind "pattern"): the pattern of bench/patterns.py and the column (fork, pl266, hand)
        self.pattern, self.column = pattern, column

    def to_dict(self) -> Dict[str, Any]:
        out = {"key": self.key, "label": self.label, "kind": self.kind, "upto": self.upto, "pl266": self.pl266}
        if self.pattern:
            out.update(pattern=self.pattern, column=self.column)
        return out


def plan_rows(series: List[str], kinds: List[Optional[str]]) -> List[Row]:
    """All rows, in table order, derived from the series: a row per ``Kind: fix`` patch, so new fixes add rows."""
    fix_idx = [i for i, k in enumerate(kinds) if k == "fix"]
    full_tag = series[-1] if series else "upstream"
    rows: List[Row] = []
    if fix_idx:
        first = fix_idx[0]
        before_upto = series[first - 1] if first > 0 else "upstream"
        rows.append(Row("before", f"1.8.6 + compat only (up to {_short(before_upto)})", "trainer-xla", before_upto))
        for i in fix_idx:
            name = series[i]
            is_full = i == len(series) - 1
            label = f"+ {_stem(name)}" + (" = full fork" if is_full else "")
            rows.append(Row("fork" if is_full else f"fix-{name[:4]}", label, "trainer-xla", name))
        if fix_idx[-1] != len(series) - 1:
            rows.append(Row("fork", f"full fork ({len(series)} patches)", "trainer-xla", full_tag))
    else:
        what = f"{len(series)} patches, no fix yet" if series else "series empty = upstream 1.8.6"
        rows.append(Row("fork", f"full fork ({what})", "trainer-xla", full_tag))
    rows.append(Row("lite", "LightningLite (fork), tpu, devices=1", "lite-xla", full_tag))
    rows.append(Row("pl266", f"Lightning {PL266_VERSION} (latest upstream)", "trainer-xla", pl266=True))
    rows.append(Row("xla-loop", "hand-written PT/XLA loop (reference)", "xla-loop"))
    rows.append(Row("xla-loop-noread", "hand-written PT/XLA loop, never reads the loss", "xla-loop-noread"))
    rows.append(Row("cpu-lightning", "fork Trainer, accelerator=cpu", "trainer-cpu", full_tag))
    rows.append(Row("cpu-loop", "hand-written CPU loop", "cpu-loop"))
    return rows


def _stem(name: str) -> str:
    return name[:-len(".patch")] if name.endswith(".patch") else name


def _short(name: str) -> str:
    return name if name == "upstream" else name[:4]


def read_series_kinds() -> Tuple[List[str], List[Optional[str]]]:
    series = fork_patches.read_series(fork_common.SERIES_FILE)
    kinds = [fork_patches.Patch.read(fork_common.PATCH_DIR / n).kind for n in series]
    return series, kinds


def select_rows(rows: List[Row], wanted: Optional[str]) -> List[Row]:
    if not wanted or wanted == "all":
        return rows
    if wanted == "none":
        return []
    keys = [w.strip() for w in wanted.split(",") if w.strip()]
    chosen = []
    for key in keys:
        match = [r for r in rows if r.key == key or (key == "fixes" and r.key.startswith("fix-"))
                 or (key.isdigit() and r.upto and r.upto.startswith(key) and r.kind == "trainer-xla")]
        if not match:
            raise BenchError(f"--rows: no row {key!r}; the rows are: {', '.join(r.key for r in rows)}")
        chosen += [r for r in match if r not in chosen]
    return [r for r in rows if r in chosen]


# --------------------------------------------------------------------------------------------- pattern rows
patterns = bench_rows.patterns_module()
PATTERN_COLUMNS = ("fork", "pl266", "hand")
PATTERN_COLUMN_TITLES = {"fork": "fork", "pl266": f"Lightning {PL266_VERSION}", "hand": "hand-written loop"}


def plan_pattern_rows(wanted: Optional[str], columns: Optional[str], full_tag: str) -> List[Row]:
    """The rows of the pattern table: one per pattern and column, in table order (pattern by pattern). ``wanted``:
    comma-separated pattern keys, ``all`` (default) or ``none``; ``columns``: of fork, pl266, hand."""
    if wanted == "none":
        return []
    keys = [p.key for p in patterns.PATTERNS] if not wanted or wanted == "all" else \
        [w.strip() for w in wanted.split(",") if w.strip()]
    cols = list(PATTERN_COLUMNS) if not columns or columns == "all" else \
        [c.strip() for c in columns.split(",") if c.strip()]
    for key in keys:
        if key not in patterns.BY_KEY:
            raise BenchError(f"--patterns: no pattern {key!r}; the patterns are: {', '.join(patterns.BY_KEY)}")
    for col in cols:
        if col not in PATTERN_COLUMNS:
            raise BenchError(f"--pattern-columns: no column {col!r}; the columns are: {', '.join(PATTERN_COLUMNS)}")
    rows = []
    for key in keys:
        for col in [c for c in PATTERN_COLUMNS if c in cols]:
            rows.append(Row(f"pattern-{col}-{key}", f"{key} ({PATTERN_COLUMN_TITLES[col]})", "pattern",
                            upto=full_tag if col == "fork" else None, pl266=col == "pl266", pattern=key, column=col))
    return rows


# --------------------------------------------------------------------------------------------- trees
def materialize(upto: str, python: str) -> Path:
    dest = BUILD / "trees" / _stem(upto) / "src"
    cmd = [python, str(ROOT / "tools" / "fork.py"), "materialize", "--upto", upto, "--dest", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"materializing the series up to {upto} failed:\n{proc.stdout}{proc.stderr}")
    return dest


def _requirements_of(dist_info: Path) -> List[str]:
    reqs = []
    for line in (dist_info / "METADATA").read_text().splitlines():
        if line.startswith("Requires-Dist:"):
            reqs.append(line.split(":", 1)[1].strip())
    return reqs


def missing_requirements(reqs: List[str], python: str) -> List[str]:
    """The requirements (extras excluded) that the row interpreter's environment does not satisfy."""
    probe = (
        "import json, sys, importlib.metadata as md\n"
        "from packaging.requirements import Requirement\n"
        "out = []\n"
        "for r in json.loads(sys.argv[1]):\n"
        "    req = Requirement(r)\n"
        "    if req.marker is not None and not req.marker.evaluate({'extra': ''}):\n"
        "        continue\n"
        "    try:\n"
        "        ok = req.specifier.contains(md.version(req.name), prereleases=True)\n"
        "    except md.PackageNotFoundError:\n"
        "        ok = False\n"
        "    if not ok:\n"
        "        out.append(str(req))\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([python, "-c", probe, json.dumps(reqs)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"could not check the requirements of Lightning {PL266_VERSION}:\n{proc.stderr}")
    return json.loads(proc.stdout)


def install_pl266(python: str) -> Tuple[Path, List[str]]:
    """``pip install --target build/bench/pl266 --no-deps pytorch-lightning==2.6.6``, plus any missing dependency
    (also into the target, never into the venv), so 2.6.6 never mixes with the fork."""
    target = BUILD / "pl266"
    dist_info = target / f"pytorch_lightning-{PL266_VERSION}.dist-info"
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q", "--target", str(target), "--no-deps"]
    if not dist_info.exists():
        proc = subprocess.run(pip + [f"pytorch-lightning=={PL266_VERSION}"], capture_output=True, text=True)
        if proc.returncode != 0 or not dist_info.exists():
            raise BenchError(f"pip could not install pytorch-lightning=={PL266_VERSION} into {target}:\n"
                             f"{proc.stdout}{proc.stderr}")
    missing = missing_requirements(_requirements_of(dist_info), python)
    if missing:
        print(f"[bench] installing the dependencies of Lightning {PL266_VERSION} missing from the venv into "
              f"{target}: {', '.join(missing)}", flush=True)
        proc = subprocess.run(pip + missing, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BenchError(f"pip could not install {missing} into {target}:\n{proc.stdout}{proc.stderr}")
    return target, missing


# --------------------------------------------------------------------------------------------- running
HAND_KINDS = ("xla-loop", "xla-loop-noread", "cpu-loop")


def _imports_no_lightning(row: Row) -> bool:
    return row.kind in HAND_KINDS or (row.kind == "pattern" and row.column == "hand")


def group_rows(rows: List[Row]) -> List[List[Row]]:
    """One process per Lightning row; the hand-written loops import no Lightning and share one process."""
    groups: List[List[Row]] = []
    hand = [r for r in rows if _imports_no_lightning(r)]
    for r in rows:
        if _imports_no_lightning(r):
            if r is hand[0]:
                groups.append(hand)
        else:
            groups.append([r])
    return groups


def run_group(rows: List[Row], sizes: Dict[str, Dict[str, Any]], budget_s: float, timeout_s: float, python: str,
              pythonpath: Optional[Path], log_dir: Path, cpu_threads: int) -> List[Dict[str, Any]]:
    """Run rows in one new process; never raises: failures come back as ``error`` entries."""
    log_dir.mkdir(parents=True, exist_ok=True)
    name = rows[0].key if len(rows) == 1 else ("pattern-hand-loops" if rows[0].pattern else "hand-loops")
    spec = {"rows": [dict({"row": r.key, "kind": r.kind, "pl266_override": r.pl266},
                          **({"pattern": r.pattern, "column": r.column} if r.pattern else {})) for r in rows],
            "sizes": list(sizes), "budget_s": budget_s, "overrides": sizes, "cpu_threads": cpu_threads}
    spec_file, out_file, log_file = (log_dir / f"{name}.spec.json", log_dir / f"{name}.result.json",
                                     log_dir / f"{name}.log")
    spec_file.write_text(json.dumps(spec, indent=1))
    out_file.unlink(missing_ok=True)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    t0 = time.perf_counter()
    with open(log_file, "w") as log:
        try:
            proc = subprocess.run([python, str(HERE / "bench_rows.py"), "--spec", str(spec_file), "--out",
                                   str(out_file)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT),
                                  timeout=timeout_s)
            rc: Optional[int] = proc.returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - t0
    if out_file.exists():
        results = json.loads(out_file.read_text())
    else:
        tail = "".join(log_file.read_text(errors="replace").splitlines(True)[-15:])
        why = f"timed out after {timeout_s:.0f} s" if rc is None else f"exit code {rc}"
        results = [{"row": r.key, "notes": [], "sizes": {
            s: {"error": f"the row's process died ({why}) before writing its result; last lines of its log:\n{tail}"}
            for s in sizes}} for r in rows]
    log_name = str(log_file.relative_to(ROOT)) if log_file.is_relative_to(ROOT) else str(log_file)
    for r, res in zip(rows, results):
        res.update(row=r.key, label=r.label, kind=r.kind, upto=r.upto, process_wall_s=wall, exit_code=rc,
                   log=log_name)
        if r.pattern:
            res.update(pattern=r.pattern, column=r.column)
        # the row must have imported the Lightning it was meant to measure
        path = res.get("versions", {}).get("lightning_path")
        if pythonpath is not None and path and not Path(path).resolve().is_relative_to(pythonpath.resolve()):
            for entry in res["sizes"].values():
                entry.setdefault("error", f"imported Lightning from {path}, not from {pythonpath}")
    return results


# --------------------------------------------------------------------------------------------- reporting
def _fmt(v: Optional[float], digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _fmt_s(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f} ms" if v < 10 else f"{v:.1f} s"


def size_stats(results: List[Dict[str, Any]], size: str) -> Dict[str, Any]:
    refs = [r["sizes"][size]["reference"]["s_per_step"] for r in results
            if size in r["sizes"] and "reference" in r["sizes"][size]]
    global_ref = next((r["sizes"][size]["measure"]["s_per_step"] for r in results
                       if r["row"] == "xla-loop" and "measure" in r["sizes"].get(size, {})), None)
    return {"reference_min_s": min(refs) if refs else None, "reference_max_s": max(refs) if refs else None,
            "xla_loop_row_s": global_ref}


def table(results: List[Dict[str, Any]], size: str) -> str:
    stats = size_stats(results, size)
    lines = [
        "| row | compiles/step | executions/step | transfers/step | s/step | host CPU/step | × hand loop (paired) "
        "| × hand loop (global) | drift | drift (medians) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        e = r["sizes"].get(size)
        if e is None:
            continue
        if "measure" not in e:
            first = e.get("error", "no result").strip().splitlines()[0][:120]
            lines.append(f"| {r['label']} | FAILED: {first} | | | | | | | | |")
            continue
        m = e["measure"]
        cpu = r["kind"] in ("trainer-cpu", "cpu-loop")
        g = stats["xla_loop_row_s"]
        flag = (" ⚠" if m.get("note") else "") + (" †" if not m.get("paired") else "")
        if (e.get("loss_check") or {}).get("ok") is False:
            flag += " ❌ does not train like the hand loop"
        lines.append(
            f"| {r['label']}{flag} | {'n/a (CPU)' if cpu else _fmt(m['compiles_per_step'])} "
            f"| {'n/a (CPU)' if cpu else _fmt(m['executions_per_step'])} "
            f"| {'n/a (CPU)' if cpu else _fmt(m['transfers_per_step'])} | {_fmt_s(m['s_per_step'])} "
            f"| {_fmt_s(m.get('host_cpu_s_per_step'))} "
            f"| {_fmt(e.get('ratio_same_process'))} | {_fmt(m['s_per_step'] / g if g else None)} "
            f"| {_fmt(m['drift'])} | {_fmt(m.get('drift_median'))} |")
    return "\n".join(lines)


def apply_loss_checks(results: List[Dict[str, Any]], sizes: List[str]) -> List[Tuple[Dict[str, Any], str]]:
    """Check every row's last loss against the hand-written XLA loop row's (same model, data and optimizer);
    return the (row, size) pairs that do not train like it."""
    wrong = []
    for size in sizes:
        ref = _get(results, "xla-loop", size)
        for res in results:
            entry = res["sizes"].get(size, {})
            if "measure" not in entry:
                continue
            if ref is None:
                entry["loss_check"] = {"ok": None, "why": "not compared: this run has no xla-loop row"}
                continue
            entry["loss_check"] = bench_rows.loss_check(entry["measure"], ref["measure"])
            if entry["loss_check"]["ok"] is False:
                wrong.append((res, size))
    return wrong


def _get(results, key: str, size: str) -> Optional[Dict[str, Any]]:
    for r in results:
        if r["row"] == key and "measure" in r["sizes"].get(size, {}):
            return r["sizes"][size]
    return None


def derived_targets(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The three numbers the fork is judged by, with their targets."""
    out = []
    # 1. small MLP: time the fork adds on XLA over the hand loop, against the time Lightning adds on the CPU.
    # Every row's time is a ratio to the paired hand-loop steps run between its own steps (the same reference
    # for XLA and CPU rows), so the differences of ratios compare times measured on the same machine at the same
    # moment; the raw version (absolute s/step of four runs made at different times) is given too.
    parts = {k: _get(results, k, "small") for k in ("fork", "xla-loop", "cpu-lightning", "cpu-loop")}
    value = raw = None
    if all(parts.values()):
        ratio = {k: v["ratio_same_process"] for k, v in parts.items()}
        rawt = {k: v["measure"]["s_per_step"] for k, v in parts.items()}
        cpu_ratio = ratio["cpu-lightning"] - ratio["cpu-loop"]
        cpu_raw = rawt["cpu-lightning"] - rawt["cpu-loop"]
        value = (ratio["fork"] - ratio["xla-loop"]) / cpu_ratio if cpu_ratio > 0 else None
        raw = (rawt["fork"] - rawt["xla-loop"]) / cpu_raw if cpu_raw > 0 else None
    out.append({"name": "small MLP: (fork - XLA hand loop) / (Lightning CPU - CPU hand loop), s/step",
                "value": value, "raw": raw, "target": 1.5})
    # 2. heavy model: fork over the hand loop of its own process
    f = _get(results, "fork", "heavy")
    loop_s = size_stats(results, "heavy")["xla_loop_row_s"]
    out.append({"name": "heavy model: fork / XLA hand loop (paired)",
                "value": f["ratio_same_process"] if f else None,
                "raw": f["measure"]["s_per_step"] / loop_s if f and loop_s else None, "target": 1.1})
    # 3. fork against the latest upstream release, each over the hand loop of its own process
    for size in SIZE_NAMES:
        f, p = _get(results, "fork", size), _get(results, "pl266", size)
        out.append({"name": f"{size}: fork / Lightning {PL266_VERSION} (s/step)",
                    "value": f["ratio_same_process"] / p["ratio_same_process"] if f and p else None,
                    "raw": f["measure"]["s_per_step"] / p["measure"]["s_per_step"] if f and p else None,
                    "target": 1.0})
    for t in out:
        t["met"] = None if t["value"] is None else t["value"] <= t["target"]
    return out


def host_cpu_comparison(results: List[Dict[str, Any]]) -> List[str]:
    """What the host's Python thread spends per step, fork against Lightning 2.6.6 and the hand loop (no target:
    it shows the host-side cost apart from how it overlaps with the device on this machine)."""
    lines = []
    for size in SIZE_NAMES:
        parts = {k: _get(results, k, size) for k in ("fork", "pl266", "xla-loop")}
        cpu = {k: v["measure"].get("host_cpu_s_per_step") for k, v in parts.items() if v}
        if len(cpu) == 3 and all(cpu.values()):
            lines.append(f"- {size}: host CPU per step (the Python thread): fork {_fmt_s(cpu['fork'])}, Lightning "
                         f"{PL266_VERSION} {_fmt_s(cpu['pl266'])}, hand loop {_fmt_s(cpu['xla-loop'])}; fork / "
                         f"{PL266_VERSION} = {_fmt(cpu['fork'] / cpu['pl266'])}")
    return lines


def targets_text(targets: List[Dict[str, Any]]) -> str:
    lines = []
    for t in targets:
        verdict = "n/a (a row is missing)" if t["met"] is None else ("MET" if t["met"] else "NOT MET")
        lines.append(f"- {t['name']}: **{_fmt(t['value'])}** (raw times: {_fmt(t['raw'])}; "
                     f"target <= {t['target']}) {verdict}")
    return "\n".join(lines)


def write_markdown(path: Path, results, targets, meta, pattern_results: Optional[List[Dict[str, Any]]] = None) -> str:
    parts = ["# Graph benchmark", ""]
    if results:
        parts += _main_tables(results, targets, meta)
    if pattern_results:
        parts += pattern_section(pattern_results, meta)
    text = "\n".join(parts)
    path.write_text(text)
    return text


def _main_tables(results, targets, meta) -> List[str]:
    parts = [
        f"PJRT_DEVICE={meta['pjrt_device']}, torch {meta['versions'].get('torch')}, "
        f"torch_xla {meta['versions'].get('torch_xla')}, {meta['date']}. "
        "Counts and times are per training step in the steady state (after the warm-up steps). "
        "`× hand loop (paired)`: the row's time over that of the hand-written PT/XLA loop run in the same process, "
        f"in turns: after every {bench_rows.PAIR_BLOCK} steps of the row, {bench_rows.PAIR_BLOCK} steps of the hand "
        "loop, so both are timed on the same machine at the same moments (rows marked † are not paired, see Notes, and "
        "are compared with hand-loop runs made around them instead); "
        "the paired hand loop's own steps are left out of the row's times and counts. `global`: over the "
        "hand-written loop row. Drift: mean of "
        "the last ten steady steps over the first ten (1.00 = flat); `host CPU/step`: CPU time of the host's Python thread "
        "(`time.thread_time()`): it leaves out the runtime's own threads but includes what the runtime does on the "
        "calling thread inside the barrier; `drift (medians)`: the median step time of the last "
        "quarter of the steady state over that of the first quarter (at least ten steps each), which a few slow "
        "steps of a busy machine do not move. ⚠: the row hit its time budget of "
        f"{meta['budget_s']:.0f} s per model size and stopped early (see Notes). The hand-written XLA loop reads "
        "the loss on the host after each step's barrier, as the progress bar of the Trainer rows does. CPU rows: "
        f"torch.set_num_threads({meta['cpu_threads'] or 'default'}) in every row's process.",
        "",
    ]
    for size in meta["sizes"]:
        cfg = meta["size_config"][size]
        stats = size_stats(results, size)
        parts += [f"## {SIZE_TITLES[size]}", "",
                  f"{cfg['steps']} steps, warm-up {cfg['warmup']}; the in-process hand-loop references took "
                  f"{_fmt_s(stats['reference_min_s'])} to {_fmt_s(stats['reference_max_s'])} per step.", "",
                  table(results, size), ""]
    parts += ["## Derived targets", "", targets_text(targets)] + host_cpu_comparison(results) + [""]
    notes = [(r["label"], n) for r in results for n in r.get("notes", [])]
    notes += [(r["label"], f"{s}: {e['measure']['note']}") for r in results for s, e in r["sizes"].items()
              if e.get("measure", {}).get("note")]
    notes += [(r["label"], f"{s}: † {e['measure']['unpaired_why']}") for r in results for s, e in r["sizes"].items()
              if e.get("measure", {}).get("unpaired_why")]
    notes += [(r["label"], f"{s}: WRONG RESULT: {e['loss_check']['why']}") for r in results
              for s, e in r["sizes"].items() if (e.get("loss_check") or {}).get("ok") is False]
    if notes:
        parts += ["## Notes", ""] + [f"- {label}: {n}" for label, n in notes] + [""]
    failed = [(r["label"], s, e["error"]) for r in results for s, e in r["sizes"].items() if "error" in e]
    if failed:
        parts += ["## Failed rows", ""]
        for label, s, err in failed:
            parts += [f"- {label} ({s}): `{err.strip().splitlines()[0][:300]}` (log: {_row_log(results, label)})"]
        parts.append("")
    return parts


PATTERN_SECTION = "## Everyday patterns"


def _pattern_counts(entry: Optional[Dict[str, Any]]) -> str:
    if entry is None:
        return "not run"
    if "measure" not in entry:
        return "FAILED: " + entry.get("error", "no result").strip().splitlines()[0][:100].replace("|", "/")
    m = entry["measure"]
    return (f"{_fmt(m['compiles_per_step'])} / {_fmt(m['executions_per_step'])} / {_fmt(m['transfers_per_step'])}"
            + (" ⚠" if m.get("note") else ""))


def _pattern_ratio(entry: Optional[Dict[str, Any]]) -> str:
    if entry is None or "measure" not in entry:
        return "-"
    return _fmt(entry.get("ratio_same_process")) + ("" if entry["measure"].get("paired") else " †")


def pattern_targets_cell(key: str, entry: Optional[Dict[str, Any]]) -> str:
    if entry is None or "measure" not in entry:
        return "-"
    missed = patterns.target_failures(key, entry["measure"])
    return "met" if not missed else "NOT MET: " + "; ".join(missed)


def pattern_table(results: List[Dict[str, Any]], columns: List[str]) -> str:
    """The pattern table: a line per pattern; per column (fork, Lightning 2.6.6, hand-written loop) the steady-state
    counts and, for the Lightning columns, the time over the pattern's paired hand loop; the fork's targets; what was
    left pending between steps; bf16 in the step graph (bf16 row)."""
    by = {(r.get("pattern"), r.get("column")): r["sizes"].get("pattern") for r in results}
    keys = [p.key for p in patterns.PATTERNS if any(k == p.key for k, _ in by)]
    cols = [c for c in PATTERN_COLUMNS if c in columns]
    head = ["pattern", "counted per"]
    for c in cols:
        title = PATTERN_COLUMN_TITLES[c]
        head.append(f"{title}: compiles / executions / transfers")
        if c != "hand":
            head.append(f"{title} × hand loop (paired)")
        if c == "fork":
            head.append("fork: targets")
    head += [f"IR left pending between steps ({' / '.join(PATTERN_COLUMN_TITLES[c] for c in cols)})",
             "bf16 in the step graph"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        p = patterns.get(key)
        cells = [p.title, p.per]
        for c in cols:
            e = by.get((key, c))
            cells.append(_pattern_counts(e))
            if c != "hand":
                cells.append(_pattern_ratio(e))
            if c == "fork":
                cells.append(pattern_targets_cell(key, e))
        measures = [(by.get((key, c)) or {}).get("measure") for c in cols]
        cells.append(" / ".join("-" if m is None or m.get("pending_ir_max") is None else str(m["pending_ir_max"])
                                for m in measures))
        if key == "bf16":
            def _b(m):
                v = None if m is None else (m.get("checks") or {}).get("bf16_in_step_graph")
                return "-" if v is None else ("yes" if v else "no")
            cells.append(" / ".join(_b(m) for m in measures))
        else:
            cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pattern_section(results: List[Dict[str, Any]], meta: Dict[str, Any]) -> List[str]:
    """The markdown lines of the pattern table's section of results/bench.md (copied into bench/README.md's
    bench-patterns block by tools/readme_bench.py)."""
    cfg = meta["pattern_config"]
    cols = meta["pattern_columns"]
    parts = [
        f"{PATTERN_SECTION}: counts per step, fork against Lightning {PL266_VERSION} and the hand-written loop",
        "",
        f"PJRT_DEVICE={meta['pjrt_device']}, torch {meta['versions'].get('torch')}, torch_xla "
        f"{meta['versions'].get('torch_xla')}, {meta['date']}. "
        f"Small MLP 64-128-10, batch 32, {cfg['steps']} steps (or batches), counted over the steady state after "
        f"{cfg['warmup']} warm-up steps; every cell is its own process. Training patterns are the base module "
        "(`self.log(\"train_loss\", loss, prog_bar=True)`, progress bar on, default callbacks, no logger) plus the named "
        "change; torchmetrics `Accuracy(task=\"multiclass\", num_classes=10)`. Counts are compilations / graph "
        "executions / device-to-host transfers per step (accumulation: per batch; validation: per validation batch). "
        f"`× hand loop (paired)`: the row's time over that of the same pattern written as a hand-written PT/XLA loop, "
        f"run in the same process in turns ({bench_rows.PAIR_BLOCK} steps each; † not paired, see Notes). Targets of "
        "the fork: 0 compilations, 1 execution and at most 1 transfer per step, nothing left pending between "
        "accumulating batches (it would be recomputed), bf16 in the step graph of the bf16 row. `IR left pending`: the "
        "most IR nodes (beyond device data) held at a step boundary in the steady state. `bf16 in the step graph`: "
        "`\"bf16\" in torch_xla._XLAC._get_xla_tensors_hlo([loss])` on the loss of the second step, before its "
        "barrier.",
        "",
        pattern_table(results, cols),
        "",
        "What the hand-written loop of each pattern does: "
        + "; ".join(f"{p.key}: {p.hand}" for p in patterns.PATTERNS) + ".",
        "",
    ]
    notes = []
    for r in results:
        for n in r.get("notes", []):
            # the same note for every row of a column (e.g. how 2.6.6 was given the XLA:CPU device): once
            if n not in [x for _, x in notes]:
                notes.append((PATTERN_COLUMN_TITLES.get(r.get("column"), r["label"]), n))
        e = r["sizes"].get("pattern", {})
        m = e.get("measure", {})
        if m.get("note"):
            notes.append((r["label"], m["note"]))
        if m.get("unpaired_why"):
            notes.append((r["label"], "† " + m["unpaired_why"]))
        if "error" in e:
            notes.append((r["label"], f"FAILED: `{e['error'].strip().splitlines()[0][:300]}` (log: {r.get('log', '?')})"))
    if notes:
        parts += ["### Notes on the patterns", ""] + [f"- {label}: {n}" for label, n in notes] + [""]
    return parts


def _row_log(results, label) -> str:
    return next((r.get("log", "?") for r in results if r["label"] == label), "?")


def write_plot(path: Path, results, sizes: List[str], size_config: Dict[str, Dict[str, Any]]) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        return f"no plot: {err} (pip install -r requirements/bench.txt)"
    fig, axes = plt.subplots(1, len(sizes), figsize=(7 * len(sizes), 5), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for r in results:
            m = r["sizes"].get(size, {}).get("measure")
            if not m:
                continue
            times = [t * 1000 for t in m["step_times"]]
            style = "--" if r["kind"] in HAND_KINDS or r["kind"] == "trainer-cpu" else "-"
            ax.plot(range(1, len(times) + 1), times, style, label=r["label"], linewidth=1.2)
        warm = size_config[size]["warmup"]
        ax.axvline(warm + 0.5, color="grey", linestyle=":", linewidth=1, label="end of warm-up")
        ax.set_yscale("log")
        ax.set_xlabel("training step")
        ax.set_ylabel("step time (ms, log scale)")
        ax.set_title(SIZE_TITLES[size], fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# --------------------------------------------------------------------------------------------- main
def _pair(text: Optional[str], flag: str) -> Optional[Tuple[int, int]]:
    if text is None:
        return None
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        raise BenchError(f"{flag} takes SMALL[,HEAVY], positive integers, not {text!r}")
    if len(vals) == 1:
        vals = [vals[0], max(1, vals[0] // 2)]
    if len(vals) != 2 or min(vals) < 1:
        raise BenchError(f"{flag} takes SMALL[,HEAVY], positive integers")
    return vals[0], vals[1]


def wanted_patterns(rows: str, pattern_keys: Optional[str]) -> str:
    """``--patterns`` as given; by default the whole table with all rows (or none), no table when ``--rows`` names
    rows (``--rows xla-loop,fork`` measures just those)."""
    return pattern_keys or ("all" if rows in ("all", "none") else "none")


def pattern_config(args) -> Dict[str, int]:
    """Steps and warm-up of the pattern cells. With the default warm-up of 20 (6 with --quick) the paired blocks of
    10 hand-loop steps that run after steps 30, 40, ... (20 with --quick) fall in the steady state."""
    cfg = {"steps": 26, "warmup": 6} if args.quick else {k: bench_rows.SIZES["pattern"][k] for k in ("steps", "warmup")}
    if args.pattern_steps:
        got = _pair(args.pattern_steps, "--pattern-steps")
        cfg = {"steps": got[0], "warmup": got[1] if "," in args.pattern_steps else max(1, got[0] // 3)}
    if cfg["steps"] < cfg["warmup"] + 2:
        raise BenchError(f"--pattern-steps: the steps ({cfg['steps']}) must exceed the warm-up ({cfg['warmup']}) by 2")
    return cfg


def build_sizes(args) -> Dict[str, Dict[str, Any]]:
    steps = _pair(args.steps, "--steps")
    warm = _pair(args.warmup, "--warmup")
    sizes: Dict[str, Dict[str, Any]] = {}
    for name in args.sizes.split(","):
        if name.strip() not in SIZE_NAMES:
            raise BenchError(f"--sizes: unknown size {name!r}; choose from {SIZE_NAMES}")
    for i, name in enumerate(SIZE_NAMES):
        if name not in [n.strip() for n in args.sizes.split(",")]:
            continue
        cfg = dict(bench_rows.SIZES[name])
        if args.quick:
            cfg.update(steps=(16, 8)[i], warmup=(6, 3)[i])
        if steps:
            cfg["steps"] = steps[i]
            cfg["warmup"] = max(1, steps[i] // 3)
        if warm:
            cfg["warmup"] = warm[i]
        if cfg["steps"] < cfg["warmup"] + 2:
            raise BenchError(f"{name}: --steps ({cfg['steps']}) must exceed --warmup ({cfg['warmup']}) by 2 or more")
        sizes[name] = {"steps": cfg["steps"], "warmup": cfg["warmup"]}
    return sizes


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--rows", default="all", help="comma-separated row keys (see below), 'fixes', or 'all'")
    parser.add_argument("--sizes", default="small,heavy", help="small,heavy")
    parser.add_argument("--steps", default=None, help="SMALL[,HEAVY] steps per row (default 200,60)")
    parser.add_argument("--warmup", default=None, help="SMALL[,HEAVY] warm-up steps (default 30,10)")
    parser.add_argument("--quick", action="store_true", help="16/8 steps, warm-up 6/3: a smoke run")
    parser.add_argument("--budget", type=float, default=8.0,
                        help="seconds one row may train one model size; a slower row stops early and says so")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a row's process is killed")
    parser.add_argument("--out", type=Path, default=ROOT / "results", help="where bench.md/json/png go")
    parser.add_argument("--cpu-threads", type=int, default=1,
                        help="torch.set_num_threads in every row's process (0: torch's default); see bench/README.md")
    parser.add_argument("--logs", type=Path, default=BUILD / "logs", help="the rows' specs, logs and raw results")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the rows (the venv's)")
    parser.add_argument("--patterns", default=None,
                        help="pattern table: comma-separated keys of bench/patterns.py, 'all' or 'none' (default: "
                             "all when --rows is all or none, none when --rows names rows)")
    parser.add_argument("--pattern-columns", default="all", help="pattern table columns: fork,pl266,hand or 'all'")
    parser.add_argument("--pattern-steps", default=None,
                        help="STEPS[,WARMUP] of every pattern cell (default 60,20; --quick: 26,6)")
    args = parser.parse_args(argv)
    try:
        return _main(args)
    except BenchError as err:
        print(f"graph_bench: error: {err}", file=sys.stderr)
        return 2
    except fork_common.ForkError as err:
        print(f"graph_bench: error: {err}", file=sys.stderr)
        return 2


def run_pattern_rows(rows: List[Row], cfg: Dict[str, int], args, trees: Dict[str, Path], pl266_target: Optional[Path],
                     setup_errors: Dict[str, str], log_dir: Path) -> List[Dict[str, Any]]:
    """Run the pattern table's cells: every Lightning cell in its own process, the hand-written loops in one."""
    out: List[Dict[str, Any]] = []
    for group in group_rows(rows):
        row = group[0]
        if row.key in setup_errors:
            got = [{"row": r.key, "label": r.label, "kind": r.kind, "pattern": r.pattern, "column": r.column,
                    "notes": [], "sizes": {"pattern": {"error": setup_errors[row.key]}}} for r in group]
        else:
            path = pl266_target if row.pl266 else (trees.get(row.upto) if row.column == "fork" else None)
            print(f"[bench] {', '.join(r.key for r in group)} ...", flush=True)
            got = run_group(group, {"pattern": cfg}, args.budget * 4, args.timeout, args.python, path, log_dir,
                            args.cpu_threads)
        for res in got:
            out.append(res)
            e = res["sizes"]["pattern"]
            what = (_pattern_counts(e) + f" (compiles / executions / transfers), x{_fmt(e.get('ratio_same_process'))}"
                    " hand loop") if "measure" in e else _pattern_counts(e)
            print(f"[bench]   {res['row']}: {what}", flush=True)
    return out


def _main(args) -> int:
    sizes = build_sizes(args)
    series, kinds = read_series_kinds()
    rows = select_rows(plan_rows(series, kinds), args.rows)
    pattern_rows = plan_pattern_rows(wanted_patterns(args.rows, args.patterns), args.pattern_columns, series[-1] if series else "upstream")
    pcfg = pattern_config(args)
    print(f"[bench] PJRT_DEVICE={os.environ['PJRT_DEVICE']}; series: {len(series)} patches "
          f"({sum(k == 'fix' for k in kinds)} fixes); rows: {', '.join(r.key for r in rows)}; "
          f"sizes: {', '.join('%s %d steps/warm-up %d' % (k, v['steps'], v['warmup']) for k, v in sizes.items())}",
          flush=True)
    log_dir = args.logs
    trees: Dict[str, Path] = {}
    setup_errors: Dict[str, str] = {}
    pl266_target = None
    for row in rows + pattern_rows:
        try:
            if row.upto is not None and row.upto not in trees:
                trees[row.upto] = materialize(row.upto, args.python)
            if row.pl266 and pl266_target is None:
                pl266_target, _ = install_pl266(args.python)
        except (BenchError, fork_common.ForkError) as err:
            setup_errors[row.key] = str(err)
    results = []
    t_start = time.perf_counter()
    for group in group_rows(rows):
        row = group[0]
        if row.key in setup_errors:
            got = [{"row": row.key, "label": row.label, "kind": row.kind, "notes": [],
                    "sizes": {s: {"error": setup_errors[row.key]} for s in sizes}}]
        else:
            path = pl266_target if row.pl266 else (trees.get(row.upto) if row.kind.startswith(("trainer", "lite"))
                                                   else None)
            print(f"[bench] {', '.join(r.key for r in group)}: {'; '.join(r.label for r in group)} ...", flush=True)
            got = run_group(group, sizes, args.budget, args.timeout, args.python, path, log_dir, args.cpu_threads)
        for res in got:
            results.append(res)
            for s, e in res["sizes"].items():
                if "measure" in e:
                    m = e["measure"]
                    print(f"[bench]   {res['row']} {s}: {m['compiles_per_step']:.2f} compiles, "
                          f"{m['executions_per_step']:.2f} executions, {m['transfers_per_step']:.2f} transfers, "
                          f"{_fmt_s(m['s_per_step'])}/step, x{_fmt(e.get('ratio_same_process'))} hand loop, "
                          f"drift {_fmt(m['drift'])}" + (f" ({m['note']})" if m.get("note") else ""), flush=True)
                else:
                    print(f"[bench]   {res['row']} {s}: FAILED: {e['error'].strip().splitlines()[0][:200]}",
                          flush=True)
    pattern_results = run_pattern_rows(pattern_rows, pcfg, args, trees, pl266_target, setup_errors, log_dir)
    # table order = plan order
    order = {r.key: i for i, r in enumerate(rows)}
    results.sort(key=lambda res: order.get(res["row"], len(order)))
    for res, s in apply_loss_checks(results, list(sizes)):
        print(f"[bench]   WARNING {res['row']} {s}: {res['sizes'][s]['loss_check']['why']}", flush=True)
    targets = derived_targets(results)
    meta = {"pjrt_device": os.environ["PJRT_DEVICE"], "date": time.strftime("%Y-%m-%d %H:%M"),
            "versions": next((r["versions"] for r in results + pattern_results if r.get("versions")), {}),
            "sizes": list(sizes), "size_config": {s: dict(bench_rows.SIZES[s], **sizes[s]) for s in sizes},
            "series": series, "kinds": kinds, "rows": [r.to_dict() for r in rows],
            "wall_s": time.perf_counter() - t_start, "budget_s": args.budget, "cpu_threads": args.cpu_threads,
            "pattern_config": pcfg, "pattern_columns": sorted({r.column for r in pattern_rows},
                                                              key=PATTERN_COLUMNS.index),
            "pattern_rows": [r.to_dict() for r in pattern_rows]}
    args.out.mkdir(parents=True, exist_ok=True)
    text = write_markdown(args.out / "bench.md", results, targets, meta, pattern_results)
    (args.out / "bench.json").write_text(json.dumps({"meta": meta, "targets": targets, "rows": results,
                                                     "patterns": pattern_results}, indent=1))
    plot_problem = write_plot(args.out / "bench.png", results, list(sizes), meta["size_config"])
    print()
    print(text)
    print(f"[bench] wrote {args.out / 'bench.md'}, {args.out / 'bench.json'}"
          + (f", {args.out / 'bench.png'}" if not plot_problem else f" ({plot_problem})"))
    failed = [f"{r['row']} ({s})" for r in results + pattern_results for s, e in r["sizes"].items() if "error" in e]
    wrong = [f"{r['row']} ({s})" for r in results for s, e in r["sizes"].items()
             if (e.get("loss_check") or {}).get("ok") is False]
    if failed:
        print(f"\ngraph_bench: FAILED ROWS: {', '.join(failed)}. See the 'Failed rows' section above and the logs "
              f"in {log_dir}.", file=sys.stderr)
    if wrong:
        print(f"\ngraph_bench: WRONG RESULTS: {', '.join(wrong)} did not end at the hand-written loop's loss; their "
              "timings do not measure the same training. See the 'Notes' section above.", file=sys.stderr)
    return 1 if failed or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
