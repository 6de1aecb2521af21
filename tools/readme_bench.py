#!/usr/bin/env python3
"""Copy the latest benchmark tables of results/ into bench/README.md and the device-bound headline into README.md,
the same as ``python3 tools/fork.py readme-bench`` (``forkq/commands/readme_bench.py``)."""
import sys

from forkq.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="readme_bench.py", command="readme-bench"))
