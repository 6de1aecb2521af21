#!/usr/bin/env python3
"""The fork as ``lightning-lite`` and as the unified ``lightning``: ``python tools/unified.py wheels | tree |
compare-upstream`` (``--help``), the same as ``python3 tools/fork.py unified ...`` (``forkq/commands/unified.py``)."""
import sys

from forkq.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="unified.py", command="unified"))
