#!/usr/bin/env python3
"""Copy the latest benchmark tables (results/bench.md) into the README, between its two bench markers."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"README.md has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    bench = (ROOT / "results" / "bench.md").read_text()
    # drop the document title; demote the section headings one level under the README's section
    lines = [line for line in bench.splitlines() if not line.startswith("# ")]
    body = "\n".join("#" + line if line.startswith("## ") else line for line in lines).strip()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{body}\n{END}{tail}")
    print("README.md: benchmark tables updated from results/bench.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
