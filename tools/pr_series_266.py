#!/usr/bin/env python3
"""The fork's fixes for Lightning 2.6.6 (``patches/2.6.6``): ``python3 tools/pr_series_266.py tree | export |
verify`` (``--help``), the same as ``python3 tools/fork.py pr-series-266 ...`` (``forkq/commands/pr_series_266.py``)."""
import sys

from forkq.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="pr_series_266.py", command="pr-series-266"))
