"""Stop early when this interpreter cannot install the fork's pinned stack.

``make demo`` and ``make test`` run this (``tools/check_python.py``) with the interpreter they are about to build
``.venv`` from, before any
download: outside the Python versions (or off the platform) that the pinned torch and torch_xla have wheels for, pip
would only fail minutes later with "No matching distribution found for torch_xla". The range is read from
``requirements/runtime.txt`` (its ``# python-requires:`` and ``# wheel-platform:`` lines), the one place that states
it; ``forkq.upstream.python_range`` reads it from here for ``setup.py``.

Written for any Python 3 (no f-strings, no annotations), so that even a too old interpreter gets the message.
Exit status: 0 when the interpreter fits, 1 with the reason on stderr when it does not.
"""
import os
import platform
import re
import sys

RUNTIME_REQUIREMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "requirements", "runtime.txt")


class PythonRange(object):
    """``>=low,<high`` over (major, minor), and the one platform (``sys.platform`` prefix, machine) with wheels."""

    def __init__(self, low, high, system, machine):
        self.low = low
        self.high = high
        self.system = system
        self.machine = machine

    @property
    def specifier(self):
        """The ``python_requires`` string, e.g. ``>=3.10,<3.14``."""
        return ">=%d.%d,<%d.%d" % (self.low + self.high)

    @property
    def highest(self):
        """The newest supported minor version: the one below the exclusive upper bound."""
        if self.high[1] == 0:
            raise ValueError("an upper bound of X.0 names no highest minor version")
        return (self.high[0], self.high[1] - 1)

    @property
    def versions(self):
        """Every supported minor version as ``"3.10"``, ..., oldest first."""
        return ["%d.%d" % (self.low[0], minor) for minor in range(self.low[1], self.highest[1] + 1)]

    def describe(self):
        """``Python 3.10 to 3.13`` (the wording the README uses)."""
        return "Python %d.%d to %d.%d" % (self.low + self.highest)

    def problem(self, version, system, machine):
        """Why an interpreter of ``version`` (major, minor) on ``system``/``machine`` cannot install the stack, or
        None."""
        version = tuple(version[:2])
        if not self.low <= version < self.high:
            return "Python %d.%d is outside the versions the pinned stack supports" % version
        if not system.startswith(self.system) or machine.lower() not in (self.machine, _ALIASES.get(self.machine)):
            return "this platform (%s, %s) has no wheel of the pinned stack" % (system, machine)
        return None


_ALIASES = {"x86_64": "amd64"}


def read_range(path=RUNTIME_REQUIREMENTS):
    """The :class:`PythonRange` stated in ``requirements/runtime.txt``; ValueError when it is missing or malformed."""
    with open(path) as f:
        text = f.read()
    spec = re.search(r"^#\s*python-requires:\s*>=\s*(\d+)\.(\d+)\s*,\s*<\s*(\d+)\.(\d+)\s*$", text, re.M)
    where = re.search(r"^#\s*wheel-platform:\s*(\w+)\s+(\w+)\s*$", text, re.M)
    if not spec or not where:
        raise ValueError("%s must state `# python-requires: >=X.Y,<X.Z` and `# wheel-platform: <system> <machine>`"
                         % path)
    low = (int(spec.group(1)), int(spec.group(2)))
    high = (int(spec.group(3)), int(spec.group(4)))
    if not low < high or low[0] != high[0]:
        raise ValueError("%s: python-requires must be >=X.Y,<X.Z within one major version" % path)
    return PythonRange(low, high, where.group(1), where.group(2).lower())


def _pins(path):
    with open(path) as f:
        pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", f.read(), re.M))
    if "torch-tpu" in pins:
        return "torch %s and torch-tpu %s" % (pins.get("torch", "?"), pins["torch-tpu"])
    return "torch %s and torch_xla %s" % (pins.get("torch", "?"), pins.get("torch_xla", "?"))


def main(argv=None):
    """``check_python.py [requirements file]``: the file of the stack about to be installed, runtime.txt (torch_xla)
    when none is named, or requirements/torchtpu.txt (TorchTPU)."""
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else RUNTIME_REQUIREMENTS
    allowed = read_range(path)
    problem = allowed.problem(sys.version_info, sys.platform, platform.machine())
    if problem is None:
        return 0
    suggestion = "python%d.%d" % allowed.highest
    sys.stderr.write(
        "error: %s (%s).\n"
        "The pinned %s (%s) have wheels for %s on %s %s only.\n"
        "Choose an interpreter in that range, e.g. `make demo PYTHON=%s` or `make test PYTHON=%s`"
        " (install one with your package manager, pyenv or uv).\n"
        % (problem, sys.executable, _pins(path), os.path.relpath(path), allowed.describe(), allowed.system,
           allowed.machine, suggestion, suggestion))
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        sys.stderr.write("That interpreter belongs to the virtual environment %s, made earlier: remove it first.\n"
                         % sys.prefix)
    return 1


if __name__ == "__main__":
    sys.exit(main())
