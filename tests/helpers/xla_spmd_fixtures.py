"""Fixtures of the SPMD tests (tests_pytorch/strategies/test_xla_spmd*.py, tests_lite/strategies/test_xla_spmd.py):
the Trainer and Lite runs on one XLA device and with each SPMD strategy on 4, each set in a process of its own, made
once per pytest session (the ``computed_once`` fixture of tests/conftest.py: the first pytest-xdist worker that needs
a set makes it, the other reads it) and shared by every module (a plugin of tests/conftest.py)."""
import os

import pytest

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICES = 4

_RUN = """
import os, sys
if {dump!r}:  # read when the runtime starts, in this process: the server this process is forked from has none
    os.environ["XLA_FLAGS"] = "--xla_dump_to=" + {dump!r}
sys.path.insert(0, {tests!r})
from helpers.xla_spmd_runs import (batch_types_run, collectives, interrupt_and_profile, lite_runs, misconfigurations,
                                   patterns_run, sharded_checkpoint_run, trainer_runs)
runs = trainer_runs({strategy!r}, {tmp!r}, resume_from={resume!r})
runs["patterns"] = patterns_run({strategy!r}, {tmp!r} + "/patterns")
runs["batch_types"] = batch_types_run({strategy!r}, {tmp!r} + "/batch_types")
lite = lite_runs({strategy!r})
found = collectives()
# after the runs: the one-device process has XLA tensors, so SPMD comes too late there
errors = misconfigurations({strategy!r} or "xla_spmd", {tmp!r})
runs["interrupt_and_profile"] = interrupt_and_profile({strategy!r}, {tmp!r}) if {strategy!r} else {{}}
runs["sharded"] = sharded_checkpoint_run({strategy!r}, {tmp!r} + "/sharded") if {strategy!r} else {{}}
emit({{"runs": runs, "lite": lite, "collectives": found, "errors": errors}})
"""


def _run(fork_server, strategy, tmp_path, devices, resume=None):
    # imported here: this module is a plugin of the root conftest, and importing Lightning before pytest's logging
    # plugin is in place makes Lightning's logger stop propagating (caplog would see nothing)
    from helpers.xla_subprocess import run_python

    # the HLO that XLA compiled for the devices, partitioned, with its collectives (XLA_FLAGS, set by the run itself)
    dump = str(tmp_path / "hlo") if strategy else ""
    # the environments of the other tests' fork servers: one device is PJRT's default on the CPU
    env = {"PJRT_DEVICE": "CPU", **({"CPU_NUM_DEVICES": str(devices)} if devices > 1 else {})}
    code = _RUN.format(tests=TESTS_DIR, strategy=strategy, tmp=str(tmp_path), resume=resume, dump=dump)
    return run_python(code, env=env, timeout=240, fork_server=fork_server)


@pytest.fixture(scope="session")
def spmd_one_device(computed_once, fork_server):
    return computed_once("spmd-one_device", lambda folder: _run(fork_server, None, folder, devices=1))


@pytest.fixture(scope="session")
def spmd_runs(computed_once, fork_server, spmd_one_device):
    """Each strategy's runs on 4 devices, resuming from the one-device run's checkpoint."""
    cache = {}

    def get(strategy):
        if strategy not in cache:
            resume = spmd_one_device["runs"]["clip"]["checkpoint"]
            cache[strategy] = computed_once(
                f"spmd-{strategy}", lambda folder: _run(fork_server, strategy, folder, devices=DEVICES, resume=resume))
        return cache[strategy]

    return get
