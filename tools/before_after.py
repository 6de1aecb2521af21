#!/usr/bin/env python3
"""Each 1.8.6 fix's tests fail without its patch and pass with it: ``python tools/before_after.py [--only NAME]
[--workers 2]``, the same as ``python3 tools/fork.py before-after ...`` (``forkq/commands/before_after.py``)."""
import sys

from forkq.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="before_after.py", command="before-after"))
