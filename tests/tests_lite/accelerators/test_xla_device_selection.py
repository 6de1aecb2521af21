"""Device selection that never lies, for Lightning Lite (patch `compat-pjrt-device-detection-and-environment`).

Only the user's ``PJRT_DEVICE``, set before anything imported torch_xla, opts in to XLA's CPU device; a value that
torch_xla set itself when it was imported never counts. Run in fresh interpreters: what matters is the environment a
process starts with and what it imported.
"""
import pytest

from helpers.xla_subprocess import run_python

pytest.importorskip("torch_xla")

_LITE = """
import os, sys, warnings
warnings.simplefilter("ignore")
import torch
from lightning_lite import LightningLite


class Lite(LightningLite):
    def run(self):
        x = torch.ones(2, 4, device=self.device)
        return str((x * 2).sum().item())


def attempt(**kwargs):
    try:
        lite = Lite(**kwargs)
        return {"device": str(lite.device), "result": lite.run()}
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err)}
"""


@pytest.mark.parametrize("pjrt_device", [None, "CUDA", "NEURON", "cpu", "garbage"])
def test_cpu_lite_neither_imports_torch_xla_nor_changes_the_environment(pjrt_device):
    out = run_python(
        _LITE
        + """
env_before = dict(os.environ)
seen = {"cpu": attempt(accelerator="cpu"), "auto": attempt(accelerator="auto")}
seen["torch_xla imported"] = "torch_xla" in sys.modules
seen["environment changed"] = sorted(k for k in set(os.environ) | set(env_before)
                                     if os.environ.get(k) != env_before.get(k))
emit(seen)
""",
        env={"PJRT_DEVICE": pjrt_device},
    )
    assert out == {
        "cpu": {"device": "cpu", "result": "16.0"},
        "auto": {"device": "cpu", "result": "16.0"},
        "torch_xla imported": False,
        "environment changed": [],
    }


def test_lite_tpu_without_opt_in_is_the_same_clear_error_every_time():
    out = run_python(
        _LITE
        + """
attempts = [attempt(accelerator="tpu", devices=1), attempt(accelerator="tpu")]
import torch_xla  # sets PJRT_DEVICE=CPU itself: not the user's choice
attempts.append(attempt(accelerator="tpu", devices=1))
emit(attempts)
""",
        env={"PJRT_DEVICE": None},
    )
    first = out[0]
    assert first["error"] == "MisconfigurationException"
    assert "PJRT_DEVICE=CPU" in first["message"] and 'pip install "torch_xla[tpu]"' in first["message"]
    assert all(a == first for a in out), out


def test_lite_tpu_with_opt_in_runs_on_xla_cpu():
    out = run_python(
        _LITE + "emit([attempt(accelerator='tpu', devices=1) for _ in range(2)] + [attempt(accelerator='auto')])",
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": None},
    )
    assert out == [{"device": "xla:0", "result": "16.0"}] * 2 + [{"device": "cpu", "result": "16.0"}]


def test_lite_bad_inputs_are_clear_errors():
    out = run_python(
        _LITE
        + """
seen = {f"devices={d!r}": attempt(accelerator="tpu", devices=d) for d in ("abc", 8, 0)}
os.environ["CPU_NUM_DEVICES"] = "abc"
seen["CPU_NUM_DEVICES=abc"] = attempt(accelerator="tpu", devices="auto")
emit(seen)
""",
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": None},
    )
    # Lite's connector refuses `devices=0` itself (upstream behaviour), before the accelerator sees it
    assert out.pop("devices=0") == {
        "error": "ValueError", "message": "`Lite(devices=0)` value is not a valid input using tpu accelerator."
    }
    assert all(r.get("error") == "MisconfigurationException" for r in out.values()), out
    assert out["devices=8"]["message"].count("`devices=1`") == 1
    assert "positive integer" in out["CPU_NUM_DEVICES=abc"]["message"]
    lower = run_python(_LITE + "emit(attempt(accelerator='tpu', devices=1))", env={"PJRT_DEVICE": "cpu"})
    assert lower["error"] == "MisconfigurationException" and "PJRT_DEVICE=CPU" in lower["message"]
