#!/usr/bin/env python3
"""Upstream's own 1.8.6 tests on the compat patches alone and on the whole series, compared:
``python tools/upstream_tests.py run --upstream PATH | compare`` (``--help``), the same as
``python3 tools/fork.py upstream-tests ...`` (``forkq/commands/upstream_tests.py``)."""
import sys

from forkq.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="upstream_tests.py", command="upstream-tests"))
