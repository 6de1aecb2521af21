#!/usr/bin/env python3
"""Each 1.8.6 fix's tests fail without its patch and pass with it: ``python tools/before_after.py [--only 0005]
[--workers 2]``. The code is ``forkq.series.before_after``."""
import sys

from forkq.series.before_after import main

if __name__ == "__main__":
    sys.exit(main())
