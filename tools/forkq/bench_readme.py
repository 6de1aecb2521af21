"""Copy the latest benchmark tables (results/bench.md, results/host.md, results/device.md) into bench/README.md.

results/bench.md has two parts: the main tables (rows of the series, Lite, Lightning 2.6.6, the hand-written loops)
and, from its "## Everyday patterns" heading on, the pattern table. The main part goes between bench/README.md's
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` markers, the pattern part between ``<!-- bench-patterns:begin -->``
and ``<!-- bench-patterns:end -->``. A part the latest run did not measure (``--rows none``, ``--patterns none``)
leaves its block as it was, when that block's figures are current. results/host.md goes between ``<!-- bench-host:begin -->`` and
``<!-- bench-host:end -->``.

results/device.md (bench/device_bench.py) goes between ``<!-- bench-device:begin -->`` and
``<!-- bench-device:end -->``, and the top-level README.md's headline quotes its two ratios and the A/A ratio, each
with its spread over the rounds, from results/device.json (between its ``bench-device`` markers). A smoke run
(``--quick``) or a run of fewer than MIN_DEVICE_ROUNDS rounds leaves both blocks as they were when they show
figures of the current series, and otherwise puts a line there that says why it is not quoted.

README.md's headline figures (between its ``bench-headline`` markers) come from results/bench.json and
results/host.json.

Only results that measured the series now in patches/1.8.6 are quoted: every result carries a stamp (``forkq.stamp``:
the fork's version and series digest, the date, the machine), and a block whose result measured another series gets
a line that says so, and which command measures it again, instead of its figures. :func:`stale_blocks` is the check
(``fork.py check``, ``make check-series``): every block either shows the stamp of a result of the current series or
says that it is not current.
"""
import json
import re
import textwrap
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from . import stamp as fork_stamp
from .blocks import splice
from .common import ROOT, ForkError
# the page the tables are written into (its "## Results" section holds the three blocks)
README = ROOT / "bench" / "README.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
PATTERNS_BEGIN, PATTERNS_END = "<!-- bench-patterns:begin -->", "<!-- bench-patterns:end -->"
# results/host.md (bench/host_bench.py): host CPU per step, fork against Lightning 2.6.6 and Lite
HOST_BEGIN, HOST_END = "<!-- bench-host:begin -->", "<!-- bench-host:end -->"
# results/device.md and results/device.json (bench/device_bench.py): wall time per step on a device-bound MLP
DEVICE_BEGIN, DEVICE_END = "<!-- bench-device:begin -->", "<!-- bench-device:end -->"
# the top-level README's headline line of the device-bound benchmark
TOP_README = ROOT / "README.md"
HEADLINE_BEGIN = "<!-- bench-device:begin: written by `python3 tools/fork.py readme-bench` from results/device.json -->"
HEADLINE_END = "<!-- bench-device:end -->"
# a published device figure is a median over at least this many rounds
MIN_DEVICE_ROUNDS = 5
# the heading that starts the pattern table's part of results/bench.md (bench/report.py PATTERN_SECTION)
PATTERN_HEADING = "## Everyday patterns"
# the top-level README's headline figures: the graph benchmark's counts and times, the host CPU per step
FIGURES_BEGIN = ("<!-- bench-headline:begin: written by `python3 tools/fork.py readme-bench` from results/bench.json, "
                 "results/host.json, results/checkpoint.json and results/llm.json -->")
# the README headline's line of the LLM benchmark: the configurations, in the order of bench/llm_bench.py
LLM_CONFIGS = ("32", "32 + ckpt", "bf16-mixed", "bf16-mixed + ckpt")
FIGURES_END = "<!-- bench-headline:end -->"
RESULTS = ROOT / "results"
# the command that measures each result again
REFRESH = {"bench": "make bench-graph", "host": "make bench-host", "device": "make bench-device",
           "checkpoint": "make bench-checkpoint", "llm": "make bench-llm"}
# the line that stands in a block instead of figures that did not measure the current series
NOT_CURRENT = "_Not current:"
# the line that stands in the device blocks instead of figures of a current run that may not be quoted
NOT_QUOTED = "_Not quoted:"
DIGEST_RE = re.compile(r"\(series\s+digest\s+([0-9a-f]{12}|unknown)\)")


class ReadmeError(ForkError):
    pass


def _body(lines, levels: int = 1) -> str:
    # drop the document title; demote the headings under the page's section (the pattern table sits in the
    # "### Everyday patterns" subsection of "## Results": two levels)
    kept = [line for line in lines if not line.startswith("# ")]
    return "\n".join("#" * levels + line if line.startswith("##") else line for line in kept).strip()


def split_bench(text: str) -> Tuple[Optional[str], Optional[str]]:
    """The page's bodies of the main tables and of the pattern table; None for a part the run did not measure."""
    lines = text.splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith(PATTERN_HEADING)), len(lines))
    main, pattern = lines[:cut], lines[cut:]
    main_body = _body(main) if any(line.startswith("| row |") for line in main) else None
    pattern_body = _body(pattern, levels=2) if pattern else None
    return main_body, pattern_body


def _spliced(text: str, begin: str, end: str, body: str, page: str = "bench/README.md") -> str:
    new = splice(text, begin, end, body + "\n")
    if new is None:
        raise ReadmeError(f"{page} has no {begin} ... {end} block")
    return new


def update_readme(readme: str, bench: str) -> str:
    main_body, pattern_body = split_bench(bench)
    stamp_line = next((line for line in bench.splitlines() if line.startswith("_" + fork_stamp.LINE_PREFIX)), None)
    if pattern_body is not None and stamp_line and stamp_line not in pattern_body:
        # the run's stamp heads results/bench.md: the pattern table's block carries it too
        pattern_body = f"{stamp_line}\n\n{pattern_body}"
    if main_body is not None:
        readme = _spliced(readme, BEGIN, END, main_body)
    if pattern_body is not None:
        readme = _spliced(readme, PATTERNS_BEGIN, PATTERNS_END, pattern_body)
    return readme


def update_host(readme: str, host: str) -> str:
    """Put results/host.md (without its title) between bench/README.md's host markers."""
    return _spliced(readme, HOST_BEGIN, HOST_END, _body(host.splitlines(), levels=2))


def device_unpublishable(device: dict) -> Optional[str]:
    """Why a device_bench.py run may not be quoted (a smoke run, too few rounds, a ratio missing), or None."""
    if device.get("meta", {}).get("quick"):
        return "a smoke run (--quick)"
    rounds = device.get("result", {}).get("rounds", 0)
    if rounds < MIN_DEVICE_ROUNDS:
        return f"{rounds} rounds, fewer than {MIN_DEVICE_ROUNDS}"
    if any(r["median"] is None for r in device.get("summary", {}).get("ratios", [])):
        return "a ratio has no value (a row failed in every round)"
    return None


def _ratio(r: dict) -> str:
    above = f"; above 1 in {r['a_slower']} of {r['rounds']} rounds" if "a_slower" in r else ""
    target = f"; target <= {r['target']:.2f}" if r.get("target") is not None else ""
    return f"**{r['median']:.2f}** ({r['min']:.2f}..{r['max']:.2f}{above}{target})"


def device_headline(device: dict) -> str:
    """The README's line: both ratios and the A/A ratio, each as median (min..max over the rounds)."""
    by = {(r["a"], r["b"]): r for r in device["summary"]["ratios"]}
    cfg, meta = device["result"]["config"], device["meta"]
    where = f"PJRT_DEVICE={meta.get('pjrt_device')}"
    if meta.get("pjrt_device") == "CPU":
        one_thread = "--xla_cpu_multi_thread_eigen=false" in (meta.get("xla_flags") or "").split()
        where = "XLA:CPU with one compute thread" if one_thread else "XLA:CPU"
    line = (f"- Device-bound MLP ({'-'.join(map(str, cfg['layers']))}, batch {cfg['batch']}, {where}), wall time "
            f"per step, median (min..max) of {device['result']['rounds']} interleaved rounds: fork / torch_xla's "
            f"idiom (`MpDeviceLoader`, loss read in an async step closure) {_ratio(by[('fork', 'idiom')])}, "
            f"fork / Lightning 2.6.6 {_ratio(by[('fork', 'pl266')])}; the fork against itself (A/A) "
            f"{_ratio(by[('fork', 'fork-aa')])}"
            + (f"; torch_xla's idiom / Lightning 2.6.6, the floor of the fork's ratio to 2.6.6 on this host, "
               f"{_ratio(by[('idiom', 'pl266')])}" if ("idiom", "pl266") in by else "")
            + f". {_measured(device)} Method and table: "
            "[bench/README.md](bench/README.md#device-bound-step-benchdevice_benchpy).")
    return _wrap(line)


def update_device(readme: str, device_md: str) -> str:
    """Put results/device.md (without its title) between bench/README.md's device markers."""
    return _spliced(readme, DEVICE_BEGIN, DEVICE_END, _body(device_md.splitlines(), levels=2))


def update_headline(top_readme: str, device: dict) -> str:
    return _spliced(top_readme, HEADLINE_BEGIN, HEADLINE_END, device_headline(device), page="README.md")


def _measured(data: dict) -> str:
    """The stamp of a result in a sentence of a headline (the check finds its digest there)."""
    st = data.get("stamp") or {}
    return (f"Measured on the fork {st.get('fork', 'unknown')} (series digest {(st.get('digest') or 'unknown')[:12]}), "
            f"{st.get('date', 'date unknown')}.")


def why_stale(data: Optional[dict], name: str, digest: str) -> Optional[str]:
    """Why results/<name>.json may not be quoted (missing, unstamped, or a run of another series), or None."""
    if data is None:
        return f"results/{name}.json is missing"
    st = data.get("stamp")
    if not st:
        return f"results/{name}.json carries no stamp"
    if not fork_stamp.is_current(st, digest):
        return (f"results/{name}.json measured the fork {st.get('fork')} on {st.get('date')}, not the series now in "
                f"patches/1.8.6")
    return None


def not_current(name: str, why: str) -> str:
    """The line that stands in a block instead of figures of a result that is not current."""
    return f"{NOT_CURRENT} {why} (its last figures stay in results/{name}.md); `{REFRESH[name]}` measures it again._"


def not_quoted(data: dict, why: str) -> str:
    """The line that stands in the device blocks when the latest result measured the current series but may not be
    quoted (``device_unpublishable``) and the blocks held no figures of the current series."""
    st = data.get("stamp") or {}
    return (f"{NOT_QUOTED} results/device.json measured the fork {st.get('fork', 'unknown')} (series digest "
            f"{(st.get('digest') or 'unknown')[:12]}) on {st.get('date', 'an unknown date')}, but it is {why} (its "
            f"figures are in results/device.md); `{REFRESH['device']}` measures it again in {MIN_DEVICE_ROUNDS} rounds "
            "or more._")


def _block_figures(text: str, begin: str, end: str) -> Optional[str]:
    """The paragraphs of a page's block that carry figures (a paragraph that says it is not current or not quoted
    carries none of its own), or None when the page has no such block."""
    start = text.find(begin)
    stop = text.find(end, start + 1) if start >= 0 else -1
    if start < 0 or stop < 0:
        return None
    body = text[text.find("\n", start) + 1:stop]
    return "\n".join(p for p in re.split(r"\n(?=- |\n)", body) if NOT_CURRENT not in p and NOT_QUOTED not in p)


def _shows_figures_of(text: str, begin: str, end: str, digest: str) -> bool:
    """Whether a page's block shows figures stamped with the series ``digest``."""
    figures = _block_figures(text, begin, end)
    return figures is not None and digest[:12] in DIGEST_RE.findall(figures)


def _read_json(path: Path) -> Optional[dict]:
    return json.loads(path.read_text()) if path.exists() else None


def _row(bench: dict, key: str, size: str = "small") -> Optional[dict]:
    for r in bench.get("rows", []):
        if r["row"] == key and "measure" in r["sizes"].get(size, {}):
            return r["sizes"][size]["measure"]
    return None


def _counts(m: Optional[dict]) -> str:
    if m is None:
        return "not measured"
    return " / ".join(f"{m[k]:.2f}".rstrip("0").rstrip(".") for k in
                      ("compiles_per_step", "executions_per_step", "transfers_per_step"))


def figures_headline(bench: dict, host: Optional[dict], host_why: Optional[str], more: Sequence[str] = ()) -> str:
    """README.md's headline figures from a current results/bench.json (and results/host.json when it is current)."""
    before, fork, pl266 = _row(bench, "before"), _row(bench, "fork"), _row(bench, "pl266")
    targets = {t["name"]: t for t in bench.get("targets", [])}
    missed = {k: v for k, v in (bench.get("pattern_targets") or {}).items() if v}
    patterns = ("every everyday pattern measured meets 0 / 1 / at most 1" if not missed else
                "everyday patterns that miss 0 / 1 / at most 1: " + ", ".join(sorted(missed)))
    vs = [targets.get(f"{size}: fork / Lightning 2.6.6 (s/step)", {}).get("value") for size in ("small", "heavy")]
    lines = [
        "Per steady training step on XLA:CPU, small MLP logging its loss to the progress bar "
        "(compilations / executions / device-to-host transfers):",
        "",
        f"- upstream 1.8.6 (compat patches only) {_counts(before)}"
        + (f" ({before['s_per_step'] * 1000:.1f} ms a step)" if before else "")
        + f"; the fork {_counts(fork)}; Lightning 2.6.6 {_counts(pl266)}; {patterns}.",
        "- Time against Lightning 2.6.6, each over its own paired hand loop: "
        + ", ".join(f"{'-' if v is None else f'{v:.2f}'} on the {what}" for v, what in zip(vs, ("small MLP", "wide one")))
        + ". " + _measured(bench),
    ]
    lines.append(_host_line(host, host_why))
    lines += list(more)
    lines.append("- Counts are exact; times on this 2-core machine are noisy: tables, method and limits in "
                 "[bench/README.md](bench/README.md).")
    return "\n".join(_wrap(line) if line.startswith("- ") else line for line in lines)


def _wrap(line: str) -> str:
    # wrapped like the README's other list items (a link or code span is never cut)
    return textwrap.fill(line, 118, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


def _host_line(host: Optional[dict], host_why: Optional[str]) -> str:
    if host_why is not None:
        return "- " + not_current("host", host_why)
    by = {(r["a"], r["b"]): r for r in host["summary"]["rows"]}
    parts = []
    if ("fork", "pl266") in by:
        parts.append(f"over Lightning 2.6.6's {by[('fork', 'pl266')]['ratio']:.2f}")
    if ("fork", "lite") in by:
        r = by[("fork", "lite")]
        parts.append(f"over Lite's {r['ratio']:.2f} ({r['diff_ms']:+.2f} ms a step)")
    return f"- Host CPU per step, the fork's Trainer {', '.join(parts)}. {_measured(host)}"


def _checkpoint_line(checkpoint: Optional[dict], why: Optional[str]) -> str:
    if why is not None:
        return "- " + not_current("checkpoint", why)
    s = checkpoint["summary"]
    b = s["background"]
    return (f"- A checkpoint ({s['state_mb']:.0f} MB of state) written in the background adds {b['added_s']:.2f} s to"
            f" the training thread, {s['background_added_over_quiet_copy']:.2f} x a quiet copy to the host (target <="
            f" 1.5), after waiting {b['wait_s']:.2f} s for the step; synchronously it stalls"
            f" {s['sync_stall_over_background_stall']:.1f} x longer. In the whole fit, where the writer shares XLA:CPU's"
            f" cores, a save costs {s['background_fit_cost_per_save_s']:.2f} s against"
            f" {s['sync_fit_cost_per_save_s']:.2f} s synchronously. {_measured(checkpoint)}"
            " [results/checkpoint.md](results/checkpoint.md).")


def _llm_line(llm: Optional[dict], why: Optional[str]) -> str:
    if why is not None:
        return "- " + not_current("llm", why)
    s = llm["summary"]
    ratios = [f"{key} {s[key]['fork']['step_s'] / s[key]['recipe']['step_s']:.2f}" for key in LLM_CONFIGS
              if key in s and s[key].get("fork", {}).get("step_s") and s[key].get("recipe", {}).get("step_s")]
    same = all(s[key]["fork"]["losses"] == s[key]["recipe"]["losses"] for key in LLM_CONFIGS
               if key in s and "losses" in s[key].get("fork", {}) and "losses" in s[key].get("recipe", {}))
    return (f"- A Llama-style decoder under FSDPv2 on {llm['config']['devices']} XLA:CPU devices, time per step of the"
            f" fork's Trainer over pytorch/xla's own FSDPv2 recipe (median of {llm['config']['rounds']} rounds;"
            f" target <= 1.05): {', '.join(ratios)}"
            + ("; the same losses at every step" if same else "; losses differ, see the table")
            + f". {_measured(llm)} Table: [results/llm.md](results/llm.md).")


def figures_block(bench: Optional[dict], host: Optional[dict], digest: str, checkpoint: Optional[dict] = None,
                  llm: Optional[dict] = None) -> str:
    """README.md's headline figures: those of current results, a line that says so for the others."""
    bench_why, host_why = why_stale(bench, "bench", digest), why_stale(host, "host", digest)
    more = [_checkpoint_line(checkpoint, why_stale(checkpoint, "checkpoint", digest)),
            _llm_line(llm, why_stale(llm, "llm", digest))]
    if bench_why is None:
        return figures_headline(bench, host, host_why, more)
    lines = ("- " + not_current("bench", bench_why), _host_line(host, host_why), *more)
    return "\n".join(_wrap(line) for line in lines)


def _block_specs():
    return [("bench/README.md", BEGIN, END, "bench"), ("bench/README.md", PATTERNS_BEGIN, PATTERNS_END, "bench"),
            ("bench/README.md", HOST_BEGIN, HOST_END, "host"), ("bench/README.md", DEVICE_BEGIN, DEVICE_END, "device"),
            ("README.md", HEADLINE_BEGIN, HEADLINE_END, "device"), ("README.md", FIGURES_BEGIN, FIGURES_END, "bench")]


def _stale_figures(text: str, begin: str, end: str, digest: str) -> Optional[str]:
    """What is wrong with the figures of a page's block (no stamp, or the stamp of another series), or None."""
    figures = _block_figures(text, begin, end)
    if figures is None:
        return None
    found = DIGEST_RE.findall(figures)
    if not figures.strip() or (found and all(d == digest[:12] for d in found)):
        return None
    if not found:
        return "carry no stamp"
    return (f"were measured on series digest {', '.join(sorted(set(d for d in found if d != digest[:12])))}, "
            f"not {digest[:12]} (the series now in patches/1.8.6)")


def stale_blocks(readme_text: str, top_text: str, digest: str) -> List[str]:
    """The generated blocks of bench/README.md and README.md that show figures of a result of another series (or of
    no stamp), each with the command that measures it again: ``fork.py check`` fails on them."""
    problems = []
    for page, begin, end, name in _block_specs():
        what = _stale_figures(readme_text if page == "bench/README.md" else top_text, begin, end, digest)
        if what:
            marker = begin[len("<!-- "):].split(":")[0]
            problems.append(f"{page}: its {marker} block shows figures that {what}: `{REFRESH[name]}` measures them "
                            "again (or `python3 tools/fork.py readme-bench` replaces them with a line that says they "
                            "are not current)")
    return problems


def render(readme_text: str, top_text: str, results: Path = RESULTS, digest: Optional[str] = None
           ) -> Tuple[str, str, List[str]]:
    """bench/README.md and README.md with their blocks written from ``results``: figures of results of the current
    series, a line that says so in place of the others; and what was written."""
    digest = fork_stamp.current_digest() if digest is None else digest
    bench_md = results / "bench.md"
    bench_text = bench_md.read_text() if bench_md.exists() else ""
    bench, host = _read_json(results / "bench.json"), _read_json(results / "host.json")
    device = _read_json(results / "device.json") if (results / "device.md").exists() else None
    what = []
    bench_why = why_stale(bench, "bench", digest)
    if bench_why is None:
        readme_text = update_readme(readme_text, bench_text)
        main_body, pattern_body = split_bench(bench_text)
        what += [n for n, b in (("benchmark tables", main_body), ("pattern table", pattern_body)) if b]
    else:
        for begin, end in ((BEGIN, END), (PATTERNS_BEGIN, PATTERNS_END)):
            readme_text = _spliced(readme_text, begin, end, not_current("bench", bench_why))
        what.append(f"benchmark and pattern tables NOT CURRENT ({bench_why})")
    host_why = why_stale(host, "host", digest)
    if host_why is None and (results / "host.md").exists():
        readme_text = update_host(readme_text, (results / "host.md").read_text())
        what.append("host CPU table")
    else:
        readme_text = _spliced(readme_text, HOST_BEGIN, HOST_END, not_current("host", host_why or "no results/host.md"))
        what.append(f"host CPU table NOT CURRENT ({host_why})")
    device_why = why_stale(device, "device", digest)
    skip_device = device_unpublishable(device) if device is not None else None
    if device_why is not None:
        readme_text = _spliced(readme_text, DEVICE_BEGIN, DEVICE_END, not_current("device", device_why))
        top_text = _spliced(top_text, HEADLINE_BEGIN, HEADLINE_END, _wrap("- " + not_current("device", device_why)),
                            page="README.md")
        what.append(f"device-bound table and headline NOT CURRENT ({device_why})")
    elif not skip_device:
        readme_text = update_device(readme_text, (results / "device.md").read_text())
        top_text = update_headline(top_text, device)
        what.append("device-bound table and headline")
    elif _shows_figures_of(readme_text, DEVICE_BEGIN, DEVICE_END, digest):
        what.append(f"device-bound blocks left as they were (results/device.json is {skip_device})")
    else:
        # the blocks speak of an earlier result: they must not go on naming it as the latest
        line = not_quoted(device, skip_device)
        readme_text = _spliced(readme_text, DEVICE_BEGIN, DEVICE_END, line)
        top_text = _spliced(top_text, HEADLINE_BEGIN, HEADLINE_END, _wrap("- " + line), page="README.md")
        what.append(f"device-bound table and headline NOT QUOTED (results/device.json is {skip_device})")
    checkpoint, llm = _read_json(results / "checkpoint.json"), _read_json(results / "llm.json")
    new_top = splice(top_text, FIGURES_BEGIN, FIGURES_END, figures_block(bench, host, digest, checkpoint, llm) + "\n")
    if new_top is not None:
        top_text = new_top
        what.append("README.md's headline figures")
    # a block this run left as it was (a part it did not measure) keeps figures of an earlier run: current or not
    for page, begin, end, name in _block_specs():
        text = readme_text if page == "bench/README.md" else top_text
        stale = _stale_figures(text, begin, end, digest)
        if stale:
            marker = begin[len("<!-- "):].split(":")[0]
            line = not_current(name, f"the figures of the {marker} block {stale}")
            text = _spliced(text, begin, end, _wrap("- " + line) if page == "README.md" else line, page=page)
            readme_text, top_text = (text, top_text) if page == "bench/README.md" else (readme_text, text)
            what.append(f"{page}'s {marker} block NOT CURRENT")
    return readme_text, top_text, what


def update() -> int:
    """Write the blocks of bench/README.md and README.md from results/; print what was written."""
    readme_text, top_text, what = render(README.read_text(), TOP_README.read_text())
    README.write_text(readme_text)
    TOP_README.write_text(top_text)
    print("bench/README.md and README.md from results/: " + "; ".join(what))
    return 0
