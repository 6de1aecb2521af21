#!/usr/bin/env python3
"""Copy the latest benchmark tables (results/bench.md, results/host.md) into bench/README.md.

results/bench.md has two parts: the main tables (rows of the series, Lite, Lightning 2.6.6, the hand-written loops)
and, from its "## Everyday patterns" heading on, the pattern table. The main part goes between bench/README.md's
``<!-- bench:begin -->`` and ``<!-- bench:end -->`` markers, the pattern part between ``<!-- bench-patterns:begin -->``
and ``<!-- bench-patterns:end -->``. A part the latest run did not measure (``--rows none``, ``--patterns none``)
leaves its block as it was. results/host.md goes between ``<!-- bench-host:begin -->`` and
``<!-- bench-host:end -->``.
"""
import sys
from pathlib import Path
from typing import Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
# the page the tables are written into (its "## Results" section holds the three blocks)
README = ROOT / "bench" / "README.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
PATTERNS_BEGIN, PATTERNS_END = "<!-- bench-patterns:begin -->", "<!-- bench-patterns:end -->"
# results/host.md (bench/host_bench.py): host CPU per step, fork against Lightning 2.6.6 and Lite
HOST_BEGIN, HOST_END = "<!-- bench-host:begin -->", "<!-- bench-host:end -->"
# the heading that starts the pattern table's part of results/bench.md (bench/graph_bench.py PATTERN_SECTION)
PATTERN_HEADING = "## Everyday patterns"


class ReadmeError(Exception):
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


def _replace_block(text: str, begin: str, end: str, body: str) -> str:
    if begin not in text or end not in text:
        raise ReadmeError(f"bench/README.md has no {begin} ... {end} block")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def update_readme(readme: str, bench: str) -> str:
    main_body, pattern_body = split_bench(bench)
    if main_body is not None:
        readme = _replace_block(readme, BEGIN, END, main_body)
    if pattern_body is not None:
        readme = _replace_block(readme, PATTERNS_BEGIN, PATTERNS_END, pattern_body)
    return readme


def update_host(readme: str, host: str) -> str:
    """Put results/host.md (without its title) between bench/README.md's host markers."""
    return _replace_block(readme, HOST_BEGIN, HOST_END, _body(host.splitlines(), levels=2))


def main() -> int:
    readme = README
    bench_path, host_path = ROOT / "results" / "bench.md", ROOT / "results" / "host.md"
    bench = bench_path.read_text() if bench_path.exists() else ""
    try:
        text = update_readme(readme.read_text(), bench)
        if host_path.exists():
            text = update_host(text, host_path.read_text())
    except ReadmeError as err:
        print(str(err), file=sys.stderr)
        return 1
    readme.write_text(text)
    main_body, pattern_body = split_bench(bench)
    what = [name for name, body in (("benchmark tables", main_body), ("pattern table", pattern_body)) if body]
    what += ["host CPU table"] if host_path.exists() else []
    print(f"bench/README.md: {', '.join(what) or 'nothing'} updated from results/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
