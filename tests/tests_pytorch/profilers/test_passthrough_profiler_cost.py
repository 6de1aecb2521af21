"""The default profiler's ``profile`` context: what it yields, and that it runs no Python per hook call."""
import sys
from typing import List

import pytest
from pytorch_lightning.profilers import PassThroughProfiler

FIXED_BY = "0031-passthrough-profiler-plain-context.patch"


def _python_calls(fn) -> List[str]:
    calls: List[str] = []

    def tracer(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(tracer)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_passthrough_profile_yields_the_action_name_and_calls_no_python():
    profiler = PassThroughProfiler()

    def use():
        with profiler.profile("[Callback]x.on_train_batch_end") as name:
            assert name == "[Callback]x.on_train_batch_end"

    use()
    calls = _python_calls(use)
    # `use`, `profile` and a plain context manager's __init__/__enter__/__exit__: no generator-based context
    # (contextlib's `helper`, the generator resumed twice), no `start`/`stop`
    assert not {"helper", "start", "stop"} & set(calls), calls
    assert len(calls) <= 5, calls


@pytest.mark.guard  # unchanged behaviour, right before the fix too
def test_passthrough_subclass_that_records_keeps_start_and_stop():
    seen = []

    class Recording(PassThroughProfiler):
        def start(self, action_name: str) -> None:
            seen.append(("start", action_name))

        def stop(self, action_name: str) -> None:
            seen.append(("stop", action_name))

    with Recording().profile("a") as name:
        assert name == "a"
        seen.append("body")
    assert seen == [("start", "a"), "body", ("stop", "a")]
