"""With SPMD on 4 XLA:CPU devices of one process, the training thread of a steady step neither reads from the devices
nor copies to them: the step's values reach the host on Lightning's copying thread, and the batches are sharded to
the devices on a loader thread, ahead of their step."""
import os

import pytest

from helpers.runif import RunIf
from helpers.xla_waits import check_a_steady_step_never_waits

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_RUN = """
import sys
sys.path.insert(0, {tests!r})
from helpers.xla_waits import pattern_run
emit({{strategy: pattern_run({pattern!r}, {root!r} + "/" + strategy, strategy=strategy, devices="auto")
       for strategy in ("xla_spmd", "xla_spmd_fsdp")}})
"""


@RunIf(xla=True)
@pytest.mark.parametrize("pattern", ["automatic", "torchmetrics"])
def test_a_steady_spmd_step_never_waits_for_the_devices(pattern, tmp_path, fork_server):
    from helpers.xla_subprocess import run_python

    runs = run_python(_RUN.format(tests=TESTS_DIR, pattern=pattern, root=str(tmp_path)),
                      env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=240, fork_server=fork_server)
    for strategy, rows in runs.items():
        check_a_steady_step_never_waits(rows)
