"""The tests of the fork's tools import them as the package they are: ``tools/forkq`` (and the tool scripts next to
it, which import it the same way)."""
import sys
from pathlib import Path

TOOLS = str(Path(__file__).resolve().parents[2] / "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)
