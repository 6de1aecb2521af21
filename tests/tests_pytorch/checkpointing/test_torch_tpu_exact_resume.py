"""A run on TorchTPU's ``"tpu"`` device killed with ``SIGKILL`` resumes from ``last.ckpt`` exactly, and one sent
``SIGTERM`` saves, exits with status 75 and resumes exactly: on one device and under DDP over 2 processes, from the
default trigger (the epoch's end) and from ``every_n_train_steps``. Exactly: the final weights equal the uninterrupted
run's bit for bit, with dropout drawing from the device's generator and random augmentations from the CPU's.

On the stand-in device here (``helpers.tpu_standin``), on the real ``torch-tpu`` in the Cloud TPU VM workflow."""
import pytest
import torch

from helpers.runif import RunIf
from helpers.torch_tpu_runs import run, run_script
from helpers.xla_subprocess import emitted

SCRIPT = """
import os
import signal
import sys

import torch
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint

MODE, DEVICES, TRIGGER, AT = os.environ["MODE"], int(os.environ["DEVICES"]), os.environ["TRIGGER"], int(os.environ["AT"])


class Data(torch.utils.data.Dataset):
    def __init__(self):
        self.base = torch.linspace(-1, 1, 24 * 16).reshape(24, 16)

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        # a random augmentation: the CPU's generator
        return self.base[i] + 0.1 * torch.randn(16)


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        # dropout: the device's generator
        loss = self.net(batch).pow(2).mean()
        self.log("loss", loss)
        return loss

    def train_dataloader(self):
        return torch.utils.data.DataLoader(Data(), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class Interrupt(pl.Callback):
    # at the start of batch AT (counted over the run), after the checkpoints of the batches before it landed
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if MODE != "full" and not trainer.ckpt_path and trainer.global_step == AT and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGKILL if MODE == "kill" else signal.SIGTERM)


def trainer():
    every = {"every_n_train_steps": 2} if TRIGGER == "steps" else {}
    return pl.Trainer(accelerator="tpu", devices=DEVICES, max_epochs=3, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir="run",
                      callbacks=[ModelCheckpoint(dirpath="ckpts", save_last=True, **every), Interrupt()])


# main
pl.seed_everything(3)
model = Model()
if MODE == "resume":
    ckpt = "last" if os.path.exists("preempted") else "ckpts/last.ckpt"
    trainer().fit(model, ckpt_path=ckpt)
else:
    try:
        trainer().fit(model)
    except SystemExit as exit_:
        open("preempted", "w").write(str(exit_.code))
        raise
emit({"weights": {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()}})
"""


def _run(folder, mode, devices, trigger, at):
    folder.mkdir(exist_ok=True)
    env = {"MODE": mode, "DEVICES": str(devices), "TRIGGER": trigger, "AT": str(at)}
    return run_script(folder, SCRIPT, devices=devices, timeout=900, env=env)


def _weights(proc):
    results = emitted(proc)
    assert proc.returncode == 0 and results, (proc.returncode, proc.stderr[-4000:])
    return {k: torch.tensor(v) for k, v in results[-1]["weights"].items()}


@RunIf(torch_tpu=True)
@pytest.mark.parametrize("devices", [1, 2], ids=["one device", "ddp 2 processes"])
@pytest.mark.parametrize(("trigger", "at"), [("epoch", 17), ("steps", 9)], ids=["epoch end (default)", "every 2 steps"])
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_an_interrupted_run_resumes_exactly(tmp_path, devices, trigger, at, signal_name):
    """12 steps an epoch on one device (24 samples, batches of 2), 6 with 2 processes; the interruption falls in the
    second epoch, one batch or more past the last checkpoint."""
    at = at if devices == 1 else at // 2
    full = _weights(_run(tmp_path / "full", "full", devices, trigger, at))
    mode = "kill" if signal_name == "SIGKILL" else "term"
    folder = tmp_path / "interrupted"
    interrupted = _run(folder, mode, devices, trigger, at)
    if signal_name == "SIGKILL":
        assert interrupted.returncode != 0 and (folder / "ckpts" / "last.ckpt").exists()
        assert not (folder / "preempted").exists()
    else:
        # the preemption checkpoint, then exit status 75 (the process that received the signal and its peers alike)
        assert interrupted.returncode == 75, interrupted.stderr[-4000:]
        assert (folder / "preempted").read_text() == "75"
    resumed = _weights(_run(folder, "resume", devices, trigger, at))
    assert full.keys() == resumed.keys()
    for name in full:
        assert torch.equal(full[name], resumed[name]), name


@RunIf(torch_tpu=True)
def test_the_device_generator_is_saved_and_restored(tmp_path):
    """The record holds the ``"tpu"`` generator's state (``torch.accelerator.random``), and setting it back makes the
    device draw the same numbers: without it a resumed run draws other dropout masks."""
    result = run(tmp_path, """
import torch
from pytorch_lightning.trainer.connectors.xla_preemption import _collect_rng_states, _set_xla_rng_state

# main
device = torch.device("tpu", 0)
torch.manual_seed(5)
states = _collect_rng_states(device)
first = torch.rand(4, device=device).cpu().tolist()
torch.rand(4, device=device)
_set_xla_rng_state(states, device)
again = torch.rand(4, device=device).cpu().tolist()
emit({"keys": sorted(states), "first": first, "again": again, "state_device": str(states["tpu"].device)})
""")
    assert result["keys"] == ["numpy", "python", "torch", "tpu"] and result["state_device"] == "cpu"
    assert result["first"] == result["again"]
