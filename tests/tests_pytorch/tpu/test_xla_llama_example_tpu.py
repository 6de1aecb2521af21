"""examples/llama_xla.py on every chip of a Cloud TPU VM: it trains and resumes exactly, and activation checkpointing
makes the compiled step smaller.

Needs real TPU hardware: XLA:CPU removes the optimization barriers that keep the recomputation apart when it
compiles, so what its buffers show is its own scheduling (smaller with checkpointing at this size, larger for a small
stack of blocks: docs/spmd.md); on a TPU the barriers stay. The XLA:CPU version of the first test is
tests_pytorch/test_xla_llama_example.py. Each run is a process of its own, one
after the other (a TPU is opened by one process at a time).
"""
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from helpers.runif import RunIf

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "llama_xla.py"
TEXT = ROOT / "README.md"
ENV: Dict[str, Optional[str]] = {"PJRT_DEVICE": "TPU", "CPU_NUM_DEVICES": None, "XLA_FLAGS": None}


def _train(env: Dict[str, Optional[str]], *args: str) -> Tuple[dict, str]:
    from helpers.xla_subprocess import subprocess_env

    proc = subprocess.run([sys.executable, str(EXAMPLE), "--text", str(TEXT), *args], env=subprocess_env(env),
                          capture_output=True, text=True, timeout=900, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout + proc.stderr


@RunIf(tpu=True)
def test_the_example_trains_and_resumes_exactly_on_every_chip(tmp_path):
    common: List[str] = ["--size", "tiny", "--steps", "12", "--checkpoint-every", "6"]
    whole, log = _train(ENV, *common, "--checkpoints", str(tmp_path / "whole"))
    _train(ENV, "--size", "tiny", "--steps", "6", "--checkpoint-every", "6", "--checkpoints", str(tmp_path / "parts"))
    resumed, resumed_log = _train(ENV, *common, "--checkpoints", str(tmp_path / "parts"), "--resume")
    losses = whole["losses"]
    assert len(losses) == 12 and losses[-1] < losses[0] - 1.0
    assert resumed["global_step"] == 12
    assert max(abs(a - b) for a, b in zip(resumed["losses"], losses[6:])) < 1e-6
    assert "XLAGraphReportWarning" not in log + resumed_log


@RunIf(tpu=True)
def test_activation_checkpointing_makes_the_compiled_step_smaller_on_a_tpu(tmp_path):
    from bench.llm_bench import compiled_memory

    memory = {}
    for name, flag in (("kept", ["--no-activation-checkpointing"]), ("checkpointed", [])):
        dump = tmp_path / f"dump-{name}"
        env = {**ENV, "XLA_FLAGS": f"--xla_dump_to={dump}"}
        _train(env, "--size", "bench", "--steps", "3", "--global-batch", "8", "--checkpoint-every", "100",
               "--checkpoints", str(tmp_path / name), *flag)
        memory[name] = compiled_memory(dump)
    # the step's temporary buffer holds the activations kept for the backward: fewer with checkpointing
    assert memory["checkpointed"]["temp_bytes"] < memory["kept"]["temp_bytes"]
