#!/usr/bin/env python3
"""The fork tool: ``python3 tools/fork.py <command>`` (``--help`` lists them). The code is the ``forkq`` package
next to this file (``tools/forkq``); only the standard library, pip and git are needed, so this also runs inside
pip's isolated build environment."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forkq.cli import main  # noqa: E402

# Kept for the code outside tools/ that still loads this file by path (bench/graph_bench.py,
# tests/tests_pytorch/test_installed_fork.py): the package's own objects, so there is one ForkError. New code
# imports forkq instead.
from forkq.common import PATCH_DIR, SERIES_FILE, ForkError  # noqa: E402,F401
from forkq.patchfile import parse_patch, read_series  # noqa: E402,F401
from forkq.tree import fork_version  # noqa: E402,F401

if __name__ == "__main__":
    sys.exit(main())
