"""The pod path of the preemption handling on real TPU hardware: torch_xla's preemption sync point.

On a pod the hosts agree on the step to stop at through the runtime's coordination service, which catches ``SIGTERM``
itself. XLA:CPU has no such service, so this runs only on a Cloud TPU VM (one host: one process stands for the pod).
The one-host agreement and the whole save-and-resume path are tested on XLA:CPU in
``tests_pytorch/trainer/connectors/test_xla_preemption*.py``.
"""
import pytest

from helpers.runif import RunIf
from helpers.xla_subprocess import run_python

FIXED_BY = "0057-feature-xla-preemption.patch"

_SYNC_POINT = """
import os, signal, time
import torch_xla
torch_xla.device()
from pytorch_lightning.trainer.connectors.xla_preemption import _RuntimeAgreement

agreement = _RuntimeAgreement()
before = [agreement.reached(step) for step in range(1, 4)]
os.kill(os.getpid(), signal.SIGTERM)
stopped_at = None
for step in range(4, 400):
    if agreement.reached(step):
        stopped_at = step
        break
    time.sleep(0.05)
agreement.close()
emit({"before": before, "stopped_at": stopped_at})
"""


@RunIf(tpu=True)
@pytest.mark.slow
def test_the_runtime_sync_point_catches_sigterm():
    result = run_python(_SYNC_POINT, env={"PJRT_DEVICE": "TPU"}, timeout=300)
    assert result["before"] == [False, False, False]
    # the process survived its SIGTERM (the runtime handles it) and the sync point says to stop
    assert result["stopped_at"] is not None
