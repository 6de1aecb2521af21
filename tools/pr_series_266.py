#!/usr/bin/env python3
"""The fork's fixes for Lightning 2.6.6 (``patches/2.6.6``): ``python3 tools/pr_series_266.py tree | export |
verify`` (``--help``). The code is ``forkq.series.pr266``."""
import sys

from forkq.series.pr266 import main

if __name__ == "__main__":
    sys.exit(main())
