"""Stop early when this interpreter cannot install the fork's pinned stack (see ``forkq/pythons.py``).

Written for any Python 3 (no f-strings, no annotations), so that even a too old interpreter gets the message.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from forkq import pythons  # noqa: E402

if __name__ == "__main__":
    sys.exit(pythons.main())
