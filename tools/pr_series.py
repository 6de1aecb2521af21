#!/usr/bin/env python3
"""The fork's upstream fixes as a ``git am`` series for upstream's tag 1.8.6: ``python3 tools/pr_series.py export |
check-tag`` (``--help``). The code is ``forkq.series.pr186``."""
import sys

from forkq.series.pr186 import main

if __name__ == "__main__":
    sys.exit(main())
