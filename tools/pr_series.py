#!/usr/bin/env python3
"""The fork's upstream fixes as a ``git am`` series for upstream's tag 1.8.6: ``python3 tools/pr_series.py export |
check-tag`` (``--help``), the same as ``python3 tools/fork.py pr-series ...`` (``forkq/commands/pr_series.py``)."""
import sys

from forkq.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="pr_series.py", command="pr-series"))
