"""Copy the latest benchmark tables (results/bench.md, results/host.md, results/device.md) into bench/README.md.

results/bench.md has two parts: the main tables (rows of the series, Lite, Lightning 2.6.6, the hand-written loops)
and, from its "## Everyday patterns" heading on, the pattern table. The main part goes between bench/README.md's
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` markers, the pattern part between ``<!-- bench-patterns:begin -->``
and ``<!-- bench-patterns:end -->``. A part the latest run did not measure (``--rows none``, ``--patterns none``)
leaves its block as it was. results/host.md goes between ``<!-- bench-host:begin -->`` and
``<!-- bench-host:end -->``.

results/device.md (bench/device_bench.py) goes between ``<!-- bench-device:begin -->`` and
``<!-- bench-device:end -->``, and the top-level README.md's headline quotes its two ratios and the A/A ratio, each
with its spread over the rounds, from results/device.json (between its ``bench-device`` markers). A smoke run
(``--quick``) or a run of fewer than MIN_DEVICE_ROUNDS rounds leaves both blocks as they were.
"""
import json
import textwrap
from typing import Optional, Tuple

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
HEADLINE_BEGIN = "<!-- bench-device:begin: written by `python3 tools/readme_bench.py` from results/device.json -->"
HEADLINE_END = "<!-- bench-device:end -->"
# a published device figure is a median over at least this many rounds
MIN_DEVICE_ROUNDS = 5
# the heading that starts the pattern table's part of results/bench.md (bench/graph_bench.py PATTERN_SECTION)
PATTERN_HEADING = "## Everyday patterns"


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
            + ". Method and table: "
            "[bench/README.md](bench/README.md#device-bound-step-benchdevice_benchpy).")
    # wrapped like the README's other list items (a link or code span is never cut)
    return textwrap.fill(line, 118, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)


def update_device(readme: str, device_md: str) -> str:
    """Put results/device.md (without its title) between bench/README.md's device markers."""
    return _spliced(readme, DEVICE_BEGIN, DEVICE_END, _body(device_md.splitlines(), levels=2))


def update_headline(top_readme: str, device: dict) -> str:
    return _spliced(top_readme, HEADLINE_BEGIN, HEADLINE_END, device_headline(device), page="README.md")


def update() -> int:
    """Write the blocks of bench/README.md and README.md from results/; print what was updated."""
    readme = README
    results = ROOT / "results"
    bench_path, host_path = results / "bench.md", results / "host.md"
    device_md, device_json = results / "device.md", results / "device.json"
    bench = bench_path.read_text() if bench_path.exists() else ""
    device = json.loads(device_json.read_text()) if device_json.exists() and device_md.exists() else None
    skip_device = device_unpublishable(device) if device is not None else None
    top = None
    text = update_readme(readme.read_text(), bench)
    if host_path.exists():
        text = update_host(text, host_path.read_text())
    if device is not None and not skip_device:
        text = update_device(text, device_md.read_text())
        top = update_headline(TOP_README.read_text(), device)
    readme.write_text(text)
    if top is not None:
        TOP_README.write_text(top)
    main_body, pattern_body = split_bench(bench)
    what = [name for name, body in (("benchmark tables", main_body), ("pattern table", pattern_body)) if body]
    what += ["host CPU table"] if host_path.exists() else []
    what += ["device-bound table"] if top is not None else []
    print(f"bench/README.md: {', '.join(what) or 'nothing'} updated from results/")
    if top is not None:
        print("README.md: the device-bound headline updated from results/device.json")
    elif skip_device:
        print(f"results/device.json is {skip_device}: the device-bound blocks of bench/README.md and README.md are "
              "left as they were")
    return 0
