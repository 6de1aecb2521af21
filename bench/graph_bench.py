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

    PJRT_DEVICE=CPU python -m bench.graph_bench [--quick] [--rows xla-loop,fork] [--sizes small]
                                                  [--steps 200,60] [--warmup 30,10] [--out results]

Writes ``results/bench.md``, ``results/bench.json`` and ``results/bench.png``; exits non-zero when a row crashed.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from tools.forkq import common as fork_common, patchfile as fork_patches, seriesfile as fork_series

from . import bench_rows, patterns
from .report import (HAND_KINDS, PATTERN_COLUMN_TITLES, PATTERN_COLUMNS, SIZE_NAMES, _fmt, _fmt_s, _pattern_counts,
                     derived_targets, row_entry, stamp, write_json, write_markdown, write_plot)
from .trees import BUILD, PL266_VERSION, ROOT, BenchError, default_pjrt_device, install_pl266, materialize, \
    module_command, row_env, stem



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
            label = f"+ {stem(name)}" + (" = full fork" if is_full else "")
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


def _short(name: str) -> str:
    return name if name == "upstream" else name[:4]


def read_series_kinds() -> Tuple[List[str], List[Optional[str]]]:
    series = fork_series.read_series(fork_common.SERIES_FILE)
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


# --------------------------------------------------------------------------------------------- running


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
    env = row_env(pythonpath)
    t0 = time.perf_counter()
    with open(log_file, "w") as log:
        try:
            proc = subprocess.run(module_command(python, "bench_rows", "--spec", str(spec_file), "--out",
                                                 str(out_file)),
                                  stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT), timeout=timeout_s)
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


# --------------------------------------------------------------------------------------------- checks
def apply_loss_checks(results: List[Dict[str, Any]], sizes: List[str]) -> List[Tuple[Dict[str, Any], str]]:
    """Check every row's last loss against the hand-written XLA loop row's (same model, data and optimizer);
    return the (row, size) pairs that do not train like it."""
    wrong = []
    for size in sizes:
        ref = row_entry(results, "xla-loop", size)
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
    default_pjrt_device()
    stamped = stamp()
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
    text = write_markdown(args.out / "bench.md", results, targets, meta, pattern_results, stamped)
    # what the fork's column of the pattern table misses of its targets, pattern by pattern (README.md's headline)
    pattern_targets = {r["pattern"]: patterns.target_failures(r["pattern"], r["sizes"]["pattern"]["measure"])
                       for r in pattern_results if r.get("column") == "fork" and "measure" in r["sizes"]["pattern"]}
    write_json(args.out / "bench.json", {"meta": meta, "targets": targets, "rows": results,
                                         "patterns": pattern_results, "pattern_targets": pattern_targets}, stamped)
    plot_problem = write_plot(args.out / "bench.png", results, list(sizes), meta["size_config"], stamped)
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
