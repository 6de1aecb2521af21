"""Count the Python calls of one function while running another, deterministically (no timing)."""
import sys
from types import CodeType
from typing import Callable


def calls_of(code: CodeType, run: Callable[[], object]) -> int:
    """How many times the function whose code object is ``code`` was entered while ``run()`` ran."""
    calls = 0

    def tracer(frame, event, arg):
        nonlocal calls
        if event == "call" and frame.f_code is code:
            calls += 1

    previous = sys.getprofile()
    sys.setprofile(tracer)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return calls
