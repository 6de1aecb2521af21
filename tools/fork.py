#!/usr/bin/env python3
"""The fork tool: ``python3 tools/fork.py <command>`` (``--help`` lists them). The code is the ``forkq`` package
next to this file (``tools/forkq``); only the standard library, pip and git are needed, so this also runs inside
pip's isolated build environment."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forkq.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
