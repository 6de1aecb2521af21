"""Device selection that never lies, for the Trainer (patch `compat-pjrt-device-detection-and-environment`).

Importing torch_xla 2.9 sets ``PJRT_DEVICE=CPU`` itself when it finds no usable TPU. Only the user's ``PJRT_DEVICE``,
set before anything imported torch_xla, opts in to XLA's CPU device. Most checks run in a fresh interpreter, because
what matters is the environment a process starts with and what it imported, which the pytest process has settled.
"""
import os

import pytest

from helpers.xla_env import fake_tpu_host, set_user_pjrt_device
from helpers.xla_subprocess import run_python

pytest.importorskip("torch_xla")

from lightning_lite.accelerators import tpu as lite_tpu  # noqa: E402
from pytorch_lightning.accelerators import TPUAccelerator  # noqa: E402
from pytorch_lightning.utilities.exceptions import MisconfigurationException  # noqa: E402

_TINY_FIT = """
import os, sys, warnings
warnings.simplefilter("ignore")
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)


def attempt(**kwargs):
    try:
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, **kwargs)
        return {"device": str(trainer.strategy.root_device)}
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err)}
"""


@pytest.mark.parametrize("pjrt_device", [None, "CPU", "cpu", "CUDA", "NEURON", "garbage"])
def test_cpu_trainer_neither_imports_torch_xla_nor_changes_the_environment(pjrt_device, tmp_path):
    """``accelerator="cpu"`` and ``"auto"`` build and fit, whatever ``PJRT_DEVICE`` holds, without importing torch_xla
    (which would set ``PJRT_DEVICE`` and other variables); ``"gpu"`` without a GPU fails without importing it too."""
    out = run_python(
        _TINY_FIT
        + f"""
env_before = dict(os.environ)
seen = {{}}
for accelerator in ("cpu", "auto"):
    trainer = pl.Trainer(accelerator=accelerator, max_steps=2, default_root_dir={str(tmp_path)!r}, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), loader())
    seen[accelerator] = [str(trainer.strategy.root_device), trainer.global_step]
seen["gpu"] = attempt(accelerator="gpu", devices=1).get("error")
seen["torch_xla imported"] = "torch_xla" in sys.modules
seen["environment changed"] = sorted(k for k in set(os.environ) | set(env_before)
                                     if os.environ.get(k) != env_before.get(k))
emit(seen)
""",
        env={"PJRT_DEVICE": pjrt_device},
    )
    assert out == {
        "cpu": ["cpu", 2],
        "auto": ["cpu", 2],
        "gpu": "MisconfigurationException",
        "torch_xla imported": False,
        "environment changed": [],
    }


def _assert_names_both_ways_out(message: str) -> None:
    assert "PJRT_DEVICE=CPU" in message
    assert 'pip install "torch_xla[tpu]"' in message


def test_tpu_without_a_tpu_and_without_opt_in_is_the_same_clear_error_every_time():
    """No TPU chip and no ``PJRT_DEVICE``: every attempt raises the same error, also after torch_xla was imported and
    set ``PJRT_DEVICE=CPU`` itself, and also when torch_xla was imported before Lightning."""
    out = run_python(
        _TINY_FIT
        + """
attempts = [attempt(accelerator="tpu", devices=1), attempt(accelerator="tpu", devices=1)]
import torch_xla  # sets PJRT_DEVICE=CPU itself: that is not the user's choice
attempts.append(attempt(accelerator="tpu", devices=1))
attempts.append(attempt(accelerator="tpu", devices="auto"))
emit({"attempts": attempts, "pjrt_device_now": os.environ.get("PJRT_DEVICE")})
""",
        env={"PJRT_DEVICE": None},
    )
    assert out["pjrt_device_now"] == "CPU"
    first = out["attempts"][0]
    assert first["error"] == "MisconfigurationException"
    _assert_names_both_ways_out(first["message"])
    assert "can not run on your system" not in first["message"]
    assert all(a == first for a in out["attempts"]), out["attempts"]

    imported_first = run_python(
        "import torch_xla\n" + _TINY_FIT + "emit(attempt(accelerator='tpu', devices=1))",
        env={"PJRT_DEVICE": None},
    )
    assert imported_first == first


def test_tpu_with_opt_in_trains_on_xla_cpu_and_says_so(tmp_path):
    """``PJRT_DEVICE=CPU`` set before start: every Trainer uses the XLA CPU device, also when torch_xla was imported
    first, and the log says it is XLA's CPU device rather than a TPU."""
    code = (
        _TINY_FIT
        + f"""
import logging, io
stream = io.StringIO()
logging.getLogger("pytorch_lightning").addHandler(logging.StreamHandler(stream))
attempts = [attempt(accelerator="tpu", devices=1) for _ in range(2)]
trainer = pl.Trainer(accelerator="tpu", devices=1, max_steps=2, default_root_dir={str(tmp_path)!r}, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), loader())
xla_log = [line for line in stream.getvalue().splitlines() if line.startswith("TPU available")]
# a CPU and an auto Trainer in the same setup: XLA's CPU device is no TPU, so no TPU is available to them either
for accelerator in ("cpu", "auto"):
    pl.Trainer(accelerator=accelerator, devices=1, max_steps=1, logger=False, enable_checkpointing=False,
               enable_progress_bar=False, enable_model_summary=False)
other_log = [line for line in stream.getvalue().splitlines() if line.startswith("TPU available")][len(xla_log):]
emit({{"attempts": attempts, "steps": trainer.global_step, "log": xla_log, "other_log": other_log}})
"""
    )
    for prefix in ("", "import torch_xla\n"):
        out = run_python(prefix + code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": None})
        assert out["attempts"] == [{"device": "xla:0"}] * 2
        assert out["steps"] == 2
        assert out["log"] and all(
            line.startswith("TPU available: False, using: XLA's CPU device") and "PJRT_DEVICE=CPU" in line
            for line in out["log"])
        assert out["other_log"] == ["TPU available: False, using: 0 TPU cores"] * 2


def test_opt_in_must_come_before_torch_xla():
    """``PJRT_DEVICE=CPU`` set in the script after Lightning but before torch_xla counts; torch_xla's own default,
    set when it was imported after Lightning, does not."""
    out = run_python(
        """
import os
import pytorch_lightning as pl
os.environ["PJRT_DEVICE"] = "CPU"
import torch_xla
trainer = pl.Trainer(accelerator="tpu", devices=1, logger=False, enable_checkpointing=False)
emit(str(trainer.strategy.root_device))
""",
        env={"PJRT_DEVICE": None},
    )
    assert out == "xla:0"
    out = run_python(
        _TINY_FIT.replace("import pytorch_lightning as pl", "import pytorch_lightning as pl\nimport torch_xla")
        + "emit([attempt(accelerator='tpu', devices=1), os.environ.get('PJRT_DEVICE')])",
        env={"PJRT_DEVICE": None},
    )
    assert out[1] == "CPU"
    assert out[0]["error"] == "MisconfigurationException"
    _assert_names_both_ways_out(out[0]["message"])


def test_bad_inputs_are_clear_errors():
    """``devices`` values and environment variables that select no device raise a ``MisconfigurationException``
    that says what to use instead."""
    out = run_python(
        _TINY_FIT
        + """
seen = {}
for devices in ("abc", 8, [5], [0, 1], 0, -1):
    seen[f"devices={devices!r}"] = attempt(accelerator="tpu", devices=devices)
for value in ("abc", "0", "-1"):
    os.environ["CPU_NUM_DEVICES"] = value
    seen[f"CPU_NUM_DEVICES={value}"] = attempt(accelerator="tpu", devices="auto")
os.environ["CPU_NUM_DEVICES"] = "abc"
seen["cpu with CPU_NUM_DEVICES=abc"] = attempt(accelerator="cpu")
emit(seen)
""",
        env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": None},
    )
    for key, result in out.items():
        if key.startswith("cpu with"):
            assert result == {"device": "cpu"}, key
            continue
        assert result.get("error") == "MisconfigurationException", (key, result)
    assert "'abc'" in out["devices='abc'"]["message"] and "devices=[0]" in out["devices='abc'"]["message"]
    eight = out["devices=8"]["message"]
    assert "only 1 XLA device" in eight
    # every suggestion is named once (the 8-device message used to suggest `devices=1` twice)
    for key in ("devices=8", "devices=-1", "devices=[0, 1]", "devices='abc'"):
        assert out[key]["message"].count("`devices=1`") == 1, out[key]["message"]
    assert "does not exist" in out["devices=[5]"]["message"]
    for value in ("abc", "0", "-1"):
        message = out[f"CPU_NUM_DEVICES={value}"]["message"]
        assert f"CPU_NUM_DEVICES={value}" in message and "positive integer" in message


@pytest.mark.parametrize("value", ["cpu", "Cpu", "tpu"])
def test_lower_case_pjrt_device_is_refused_clearly(value):
    """torch_xla matches ``PJRT_DEVICE`` case-sensitively (``cpu`` fails at the first tensor with "No PjRtPlugin
    registered for: cpu"), so Lightning refuses it up front and names the spelling that works."""
    out = run_python(_TINY_FIT + "emit([attempt(accelerator='tpu', devices=1) for _ in range(2)])",
                     env={"PJRT_DEVICE": value})
    assert out[0] == out[1]
    assert out[0]["error"] == "MisconfigurationException"
    assert f"PJRT_DEVICE={value}" in out[0]["message"] and f"PJRT_DEVICE={value.upper()}" in out[0]["message"]


@pytest.mark.parametrize("value", ["CUDA", "NEURON", "garbage"])
def test_only_the_tpu_accelerator_validates_pjrt_device(monkeypatch, tmp_path, value):
    set_user_pjrt_device(monkeypatch, value)
    assert not TPUAccelerator.is_available()
    with pytest.raises(MisconfigurationException, match=f"PJRT_DEVICE={value}` is not supported"):
        import pytorch_lightning as pl

        pl.Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False)


def test_tpu_chips_without_libtpu_name_the_tpu_install(monkeypatch, tmp_path):
    """A TPU VM whose torch_xla lacks the ``[tpu]`` extra: torch_xla would fall back to the CPU; Lightning says how to
    install the TPU runtime instead, and ``accelerator="auto"`` does not pick the TPU."""
    import pytorch_lightning as pl

    set_user_pjrt_device(monkeypatch, None)
    fake_tpu_host(monkeypatch, chips=4, libtpu=False)
    assert not TPUAccelerator.is_available()
    for _ in range(2):
        with pytest.raises(MisconfigurationException, match="4 TPU chip") as err:
            pl.Trainer(accelerator="tpu", devices="auto", default_root_dir=tmp_path, logger=False)
        _assert_names_both_ways_out(str(err.value))
    assert pl.Trainer(accelerator="auto", default_root_dir=tmp_path, logger=False).strategy.root_device.type == "cpu"

    fake_tpu_host(monkeypatch, chips=4, libtpu=True)
    assert TPUAccelerator.is_available() and TPUAccelerator.auto_device_count() == 4


def test_pjrt_device_tpu_without_chips(monkeypatch, tmp_path):
    import pytorch_lightning as pl

    set_user_pjrt_device(monkeypatch, "TPU")
    fake_tpu_host(monkeypatch, chips=0, libtpu=True)
    with pytest.raises(MisconfigurationException, match="PJRT_DEVICE=TPU` selects a TPU, but this host has no TPU"):
        pl.Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False)


def test_chip_count_without_torch_xla_agrees_with_torch_xla():
    """Before torch_xla is imported the PCI bus is read here, with the device ids of the installed torch_xla."""
    from torch_xla._internal import tpu

    assert lite_tpu._tpu_pci_ids() == (tpu._GOOGLE_PCI_VENDOR_ID, tuple(tpu._TPU_PCI_DEVICE_IDS))
    out = run_python(
        """
import sys
from lightning_lite.accelerators import tpu as lite_tpu
count = lite_tpu._tpu_chip_count()
emit([count, "torch_xla" in sys.modules])
"""
    )
    assert out == [tpu.num_available_chips(), False]


def test_readme_says_auto_never_picks_xla_cpu():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md")).read()
    # the sentence may wrap anywhere in the Markdown source
    assert "never picks XLA on the CPU" in " ".join(readme.split())
