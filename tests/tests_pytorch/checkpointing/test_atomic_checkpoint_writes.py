"""A checkpoint is replaced atomically: a process killed, or a save that fails, while ``last.ckpt`` is written leaves
the previous checkpoint in place and loadable, on XLA (``XLACheckpointIO``) and on the CPU (``TorchCheckpointIO``).

The kill is placed exactly: the writing process sets its file size limit (``RLIMIT_FSIZE``) to half the size of the
checkpoint and restores the default action of ``SIGXFSZ``, so the kernel kills it the moment the new checkpoint's
bytes pass that size, whichever file they go to. The surviving file is loaded in a fresh interpreter where
``import torch_xla`` is blocked, as on a machine without torch_xla.
"""
import hashlib
import os
import signal
import stat
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_subprocess import emitted, run_code

pytest.importorskip("torch_xla")

from lightning_lite.plugins import TorchCheckpointIO  # noqa: E402

FIXED_BY = "0018-atomic-checkpoint-writes.patch"

_WRITER = """
import hashlib, os, resource, signal, sys, warnings
warnings.simplefilter("ignore")
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import pytorch_lightning as pl


class Wide(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(256, 256)  # a checkpoint of about 0.5 MB
        self.poison = False

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_save_checkpoint(self, checkpoint):
        if self.poison:
            # copies fine (so `xm.save` gets past its walk over the checkpoint), fails when pickled into the file
            checkpoint["poison"] = lambda: None


model = Wide()
trainer = pl.Trainer(accelerator={accelerator!r}, devices=1, max_steps=2, default_root_dir={root!r}, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, DataLoader(TensorDataset(torch.randn(8, 256)), batch_size=4))
path = os.path.join({root!r}, "last.ckpt")
trainer.save_checkpoint(path)
with open(path, "rb") as f:
    good = f.read()
emit({{"size": len(good), "sha256": hashlib.sha256(good).hexdigest(),
       "weight_sum": float(model.layer.weight.detach().cpu().double().sum())}})

with torch.no_grad():
    model.layer.weight.add_(1.0)  # the next checkpoint differs from the good one
if {fault!r} == "kill":
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (len(good) // 2, resource.RLIM_INFINITY))
    trainer.save_checkpoint(path)
    emit("not killed")
else:
    model.poison = True
    try:
        trainer.save_checkpoint(path)
        emit("saved")
    except Exception as err:
        emit({{"raised": type(err).__name__}})
"""

_LOADER = """
import sys
sys.modules["torch_xla"] = None  # a machine without torch_xla: `import torch_xla` raises
import hashlib
from lightning_lite.utilities.cloud_io import _load

path = {path!r}
with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
checkpoint = _load(path, map_location="cpu")
emit({{"sha256": digest, "weight_sum": float(checkpoint["state_dict"]["layer.weight"].double().sum()),
       "torch_xla": sys.modules["torch_xla"] is None}})
"""


def _run(code: str, env: Dict[str, Optional[str]], **run: Any) -> Tuple[int, List[Any], str]:
    """Run ``code`` in a new process that imports the tree under test; return (exit code, emitted values, the end of
    its stderr)."""
    proc = run_code(code, env=env, timeout=300, **run)
    return proc.returncode, emitted(proc), proc.stderr[-3000:]


def _check_previous_checkpoint_survives(tmp_path, accelerator: str, fault: str, **run: Any):
    code, values, stderr = _run(_WRITER.format(accelerator=accelerator, root=str(tmp_path), fault=fault),
                                {"PJRT_DEVICE": "CPU"}, **run)
    assert values, stderr
    good = values[0]
    if fault == "kill":
        # killed by the kernel in the middle of writing the new checkpoint's bytes
        assert code == -signal.SIGXFSZ, (code, values, stderr)
    else:
        assert code == 0 and "raised" in values[1], (code, values, stderr)
        # nothing is left behind: no temporary file, no partial checkpoint
        assert os.listdir(tmp_path) == ["last.ckpt"]

    path = tmp_path / "last.ckpt"
    assert path.stat().st_size == good["size"]
    # a fresh interpreter, where `import torch_xla` fails
    code, values, stderr = _run(_LOADER.format(path=str(path)), {"PYTHONDONTWRITEBYTECODE": "1"})
    assert code == 0 and values, stderr
    assert values[0] == {"sha256": good["sha256"], "weight_sum": good["weight_sum"], "torch_xla": True}


@RunIf(xla=True)
def test_kill_while_writing_on_xla_keeps_the_previous_checkpoint(tmp_path, fork_server):
    _check_previous_checkpoint_survives(tmp_path, "tpu", "kill", fork_server=fork_server)


def test_kill_while_writing_on_cpu_keeps_the_previous_checkpoint(tmp_path, fork_server):
    _check_previous_checkpoint_survives(tmp_path, "cpu", "kill", fork_server=fork_server)


@RunIf(xla=True)
def test_failed_save_on_xla_keeps_the_previous_checkpoint(tmp_path, fork_server):
    _check_previous_checkpoint_survives(tmp_path, "tpu", "raise", fork_server=fork_server)


@pytest.mark.guard
def test_failed_save_on_cpu_keeps_the_previous_checkpoint(tmp_path, fork_server):
    """Upstream's CPU path serialises into memory before it opens the file, so a save that raises already left the
    previous checkpoint alone; this keeps it so."""
    _check_previous_checkpoint_survives(tmp_path, "cpu", "raise", fork_server=fork_server)


@pytest.mark.guard
def test_replaced_checkpoint_has_the_permissions_of_a_new_file(tmp_path):
    """The temporary file that replaces the checkpoint is created like a plain new file: its mode follows the umask,
    it is not the private mode of a ``tempfile`` file."""
    umask = os.umask(0)
    os.umask(umask)
    io = TorchCheckpointIO()
    path = tmp_path / "sub" / "model.ckpt"
    for value in (1.0, 2.0):
        io.save_checkpoint({"value": torch.tensor(value)}, path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
        assert torch.load(path)["value"] == value
    assert os.listdir(path.parent) == ["model.ckpt"]
