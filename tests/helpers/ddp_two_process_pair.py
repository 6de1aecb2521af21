"""Two real OS processes of data-parallel training on XLA, each with its own XLA:CPU device: ``run_pair`` starts both
ranks of ``helpers/ddp_two_process_worker.py`` (their all-reduce carried over gloo, ``helpers/gloo_xla_collectives.py``)
and returns what each wrote; ``check_in_sync`` and ``check_one_reduce_per_step`` judge them against each other and
against the one-process reference of ``helpers/ddp_replicas.py``. Used by
``tests_pytorch/test_xla_ddp_two_processes*.py``.
"""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import lightning_lite
import pytorch_lightning
import torch

from helpers import ddp_two_process_worker as worker
from helpers.ddp_replicas import max_diff

PROBLEM = worker.PROBLEM
WORLD_SIZE = 2
TIMEOUT = 150  # seconds for the pair; a hang (e.g. a peer that never joins) fails instead of blocking
# the trees the test imports (PYTHONPATH=/tmp/upto... in `fork.py before-after`): the workers must import the same
_SRC_ROOTS = sorted({str(Path(m.__file__).resolve().parent.parent) for m in (lightning_lite, pytorch_lightning)})


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(variant: str, out_dir: Path) -> List[dict]:
    """Run both ranks of ``variant`` and return what each wrote; fail with their logs if either fails or hangs."""
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env.pop("CPU_NUM_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join([*_SRC_ROOTS, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    procs, logs = [], []
    for rank in range(WORLD_SIZE):
        log = open(out_dir / f"rank{rank}.log", "w")
        logs.append(log)
        cmd = [sys.executable, worker.__file__, variant, str(rank), str(WORLD_SIZE), init_method, str(out_dir)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + TIMEOUT
    try:
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    output = "\n".join(f"--- rank {r}\n{(out_dir / f'rank{r}.log').read_text()[-4000:]}" for r in range(WORLD_SIZE))
    assert codes is not None, f"{variant}: the two processes did not finish within {TIMEOUT} s\n{output}"
    assert codes == [0] * WORLD_SIZE, f"{variant}: exit codes {codes}\n{output}"
    results = [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    for r in results:
        assert r["pytorch_lightning"] == str(Path(pytorch_lightning.__file__).resolve()), "worker imported another tree"
    return results


def check_one_reduce_per_step(results: List[dict], closure_loss: bool) -> None:
    """Every rank made exactly one all-reduce call per optimizer step, over all the gradients, and, when the step
    runs a closure (the Trainer's automatic optimization), the closure's loss in the same call."""
    operands = len(list(PROBLEM.make_model().parameters())) + int(closure_loss)
    for r in results:
        assert r["calls_per_step"] == [1] * PROBLEM.steps, f"rank {r['rank']}: all-reduce calls per step"
        assert r["tensors_per_call"] == [operands] * PROBLEM.steps, f"rank {r['rank']}: every call reduces every grad"


def check_in_sync(results: List[dict]) -> List[dict]:
    first, second = results
    assert max_diff(first["init"], second["init"]) == 0.0, "the replicas did not start from the same parameters"
    spread = max_diff(first["params"], second["params"])
    counts = [(r["calls_per_step"], r["tensors_per_call"]) for r in results]
    assert spread < 1e-6, (
        f"replicas differ by {spread:.3g} after {PROBLEM.steps} steps: their gradients were not averaged before the "
        f"update (per rank, all-reduce calls per step and tensors per call: {counts})"
    )
    assert max_diff(first["params"], first["init"]) > 1e-3, "the parameters did not move: no training happened"
    error = max_diff(first["params"], PROBLEM.reference_params(first["init"], WORLD_SIZE))
    assert error < 1e-5, (
        f"replicas differ by {error:.3g} from one process trained on both shards: the gradients were not averaged "
        f"exactly once per update (per rank, all-reduce calls per step and tensors per call: {counts})"
    )
    return results
