"""A pytest plugin that puts upstream's own tests on one XLA device without editing them.

``forkq.series.upstream_tests`` loads it (``-p fork_upstream_xla``) when it runs upstream 1.8.6's tests on XLA. The
``Trainer`` goes on XLA through upstream's own environment defaults (``PL_TRAINER_ACCELERATOR=tpu`` and
``PL_TRAINER_DEVICES=1``, read by ``_defaults_from_env_vars``); ``LightningLite`` has no such defaults in 1.8.6, so
this plugin gives it the same rule under ``PL_LITE_ACCELERATOR`` and ``PL_LITE_DEVICES``: a value applies only where
the test does not pass that argument itself.

It also starts the XLA runtime once, before the first test: torch_xla sets environment variables of its own when it
starts (``GRPC_VERBOSITY``, ...), and upstream's ``restore_env_variables`` fixture would otherwise report them as
leaked by whichever test happened to start it. This module imports nothing of the fork's tools: it runs inside the
tree under test, on the tree's own ``PYTHONPATH``.
"""
import functools
import inspect
import os
from typing import Any, Dict

#: the Lite arguments this plugin can default, and the environment variable that holds each
LITE_ENV = {"accelerator": "PL_LITE_ACCELERATOR", "devices": "PL_LITE_DEVICES"}


def _parse(value: str) -> Any:
    """An environment value as upstream's ``parse_env_variables`` reads it: a literal where it is one, else the
    string (``"1"`` -> ``1``, ``"tpu"`` -> ``"tpu"``)."""
    import ast

    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def lite_defaults() -> Dict[str, Any]:
    """``{argument: value}`` for the ``PL_LITE_*`` variables that are set."""
    return {arg: _parse(os.environ[var]) for arg, var in LITE_ENV.items() if os.environ.get(var)}


def _wrap_lite_init(lite_cls: type, defaults: Dict[str, Any]) -> None:
    original = lite_cls.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)
        for name, value in defaults.items():
            if name not in bound.arguments:
                kwargs[name] = value
        original(self, *args, **kwargs)

    lite_cls.__init__ = __init__  # type: ignore[misc]


def pytest_configure(config: Any) -> None:
    defaults = lite_defaults()
    if defaults:
        from lightning_lite.lite import LightningLite

        _wrap_lite_init(LightningLite, defaults)
    if os.environ.get("PJRT_DEVICE"):
        import torch_xla

        torch_xla.device()  # the runtime starts here, and sets its environment variables before any test


#: names a file of the tests to keep, one per line: a JUnit key (``<module.Class>::<test[params]>``, as
#: ``forkq.series.upstream_tests.read_outcomes`` reads them) or ``file:<path>`` for every test of a module
ONLY_ENV = "FORK_UPSTREAM_ONLY"


def junit_key(nodeid: str) -> str:
    """The key a test has in an xunit1 JUnit report: ``tests/a/test_b.py::C::test_d[x]`` -> ``tests.a.test_b.C::test_d[x]``.

    pytest's ``junitxml`` names a test so; the list of tests to keep is written from such reports, and a node id
    could not stand in for it (a parametrized id may hold spaces or ``::``)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = names[0].replace("/", ".")
    if names[0].endswith(".py"):
        names[0] = names[0][: -len(".py")]
    names[-1] += bracket + params
    return "::".join([".".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def pytest_collection_modifyitems(config: Any, items: list) -> None:
    only = os.environ.get(ONLY_ENV)
    if not only:
        return
    lines = [line for line in open(only, encoding="utf-8").read().splitlines() if line]
    files = {line[len("file:"):] for line in lines if line.startswith("file:")}
    keys = set(lines)
    keep, drop = [], []
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        (keep if path in files or junit_key(item.nodeid) in keys else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
