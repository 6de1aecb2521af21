"""The benchmarks' reporting: every result under ``results/`` is written here, stamped with what it measured.

:func:`stamp` says what a run measured (the fork's version with the digest of its series, the date, the machine:
``forkq.stamp``); :func:`write_json` puts it in a JSON result as its ``stamp`` and :func:`write_markdown_page` as the
line under a Markdown result's title. The pages that quote results (``README.md``, ``bench/README.md``) quote only
results whose stamp names the series now in ``patches/1.8.6`` (``python3 tools/fork.py readme-bench``,
``make check-series``).

The graph benchmark's tables, derived targets, pattern table and plot are made here too (``bench.graph_bench`` runs
the rows). This module imports neither torch nor Lightning at import time.
"""
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from tools.forkq import stamp as fork_stamp

from .trees import PL266_VERSION

SIZE_NAMES = ("small", "heavy")
SIZE_TITLES = {
    "small": "small MLP 64-128-10, batch 32 (overhead dominates)",
    "heavy": "wide MLP 512-1024-1024-10, batch 128 (compute dominates)",
}
PATTERN_COLUMNS = ("fork", "pl266", "hand")
PATTERN_COLUMN_TITLES = {"fork": "fork", "pl266": f"Lightning {PL266_VERSION}", "hand": "hand-written loop"}
HAND_KINDS = ("xla-loop", "xla-loop-noread", "cpu-loop")


# --------------------------------------------------------------------------------------------- stamps
def stamp(tree: Optional[str] = None) -> Dict[str, Any]:
    """What a run that starts now measures: the series now in ``patches/1.8.6`` (its version and digest), today, this
    machine; ``tree``: where the rows' fork came from, when not a tree of that series made for the run."""
    return fork_stamp.make(**({"tree": tree} if tree else {}))


def write_json(path: Path, data: Dict[str, Any], stamped: Dict[str, Any]) -> None:
    """``data`` as a JSON result, its ``stamp`` first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stamp": stamped, **{k: v for k, v in data.items() if k != "stamp"}}, indent=1))


def stamped_markdown(text: str, stamped: Dict[str, Any]) -> str:
    """``text`` (a Markdown result) with the stamp's line under its title (``# ...``), in place of an older one."""
    lines = text.splitlines()
    lines = [x for x in lines if not x.startswith("_" + fork_stamp.LINE_PREFIX)]
    at = 1 if lines and lines[0].startswith("# ") else 0
    body = lines[at:]
    while body and not body[0].strip():
        body = body[1:]
    out = lines[:at] + ([""] if at else []) + [fork_stamp.line(stamped), ""] + body
    return "\n".join(out) + "\n"


def write_markdown_page(path: Path, text: str, stamped: Dict[str, Any]) -> str:
    """Write ``text`` with its stamp line; return what was written."""
    text = stamped_markdown(text, stamped)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


# --------------------------------------------------------------------------------------------- the graph benchmark
def _patterns():
    from . import patterns  # torch: only the pattern table needs it

    return patterns


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



def row_entry(results, key: str, size: str) -> Optional[Dict[str, Any]]:
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
    parts = {k: row_entry(results, k, "small") for k in ("fork", "xla-loop", "cpu-lightning", "cpu-loop")}
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
    f = row_entry(results, "fork", "heavy")
    loop_s = size_stats(results, "heavy")["xla_loop_row_s"]
    out.append({"name": "heavy model: fork / XLA hand loop (paired)",
                "value": f["ratio_same_process"] if f else None,
                "raw": f["measure"]["s_per_step"] / loop_s if f and loop_s else None, "target": 1.1})
    # 3. fork against the latest upstream release, each over the hand loop of its own process
    for size in SIZE_NAMES:
        f, p = row_entry(results, "fork", size), row_entry(results, "pl266", size)
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
        parts = {k: row_entry(results, k, size) for k in ("fork", "pl266", "xla-loop")}
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


def write_markdown(path: Path, results, targets, meta, pattern_results: Optional[List[Dict[str, Any]]] = None,
                   stamped: Optional[Dict[str, Any]] = None) -> str:
    """results/bench.md: the main tables and the pattern table, under the run's stamp line."""
    parts = ["# Graph benchmark", ""]
    if results:
        parts += _main_tables(results, targets, meta)
    if pattern_results:
        parts += pattern_section(pattern_results, meta)
    return write_markdown_page(path, "\n".join(parts), stamped if stamped is not None else stamp())


def _main_tables(results, targets, meta) -> List[str]:
    from .bench_rows import PAIR_BLOCK  # torch: the rows' module

    parts = [
        f"PJRT_DEVICE={meta['pjrt_device']}, torch {meta['versions'].get('torch')}, "
        f"torch_xla {meta['versions'].get('torch_xla')}, {meta['date']}. "
        "Counts and times are per training step in the steady state (after the warm-up steps). "
        "`× hand loop (paired)`: the row's time over that of the hand-written PT/XLA loop run in the same process, "
        f"in turns: after every {PAIR_BLOCK} steps of the row, {PAIR_BLOCK} steps of the hand "
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
    missed = _patterns().target_failures(key, entry["measure"])
    return "met" if not missed else "NOT MET: " + "; ".join(missed)


def pattern_table(results: List[Dict[str, Any]], columns: List[str]) -> str:
    """The pattern table: a line per pattern; per column (fork, Lightning 2.6.6, hand-written loop) the steady-state
    counts and, for the Lightning columns, the time over the pattern's paired hand loop; the fork's targets; what was
    left pending between steps; bf16 in the step graph (bf16 row)."""
    by = {(r.get("pattern"), r.get("column")): r["sizes"].get("pattern") for r in results}
    keys = [p.key for p in _patterns().PATTERNS if any(k == p.key for k, _ in by)]
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
        p = _patterns().get(key)
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
    bench-patterns block by tools/fork.py readme-bench)."""
    from .bench_rows import PAIR_BLOCK  # torch: the rows' module

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
        f"run in the same process in turns ({PAIR_BLOCK} steps each; † not paired, see Notes). Targets of "
        "the fork: 0 compilations, 1 execution and at most 1 transfer per step, nothing left pending between "
        "accumulating batches (it would be recomputed), bf16 in the step graph of the bf16 row. `IR left pending`: the "
        "most IR nodes (beyond device data) held at a step boundary in the steady state. `bf16 in the step graph`: "
        "`\"bf16\" in torch_xla._XLAC._get_xla_tensors_hlo([loss])` on the loss of the second step, before its "
        "barrier.",
        "",
        pattern_table(results, cols),
        "",
        "What the hand-written loop of each pattern does: "
        + "; ".join(f"{p.key}: {p.hand}" for p in _patterns().PATTERNS) + ".",
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


def write_plot(path: Path, results, sizes: List[str], size_config: Dict[str, Dict[str, Any]],
               stamped: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """results/bench.png: step times of every row, the stamp's line in the PNG's ``Description``."""
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
    fig.savefig(path, dpi=110, metadata={"Description": fork_stamp.line(stamped if stamped is not None else stamp())})
    plt.close(fig)
    return None

