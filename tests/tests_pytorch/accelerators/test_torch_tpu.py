"""The Trainer and Lite on TorchTPU's ``"tpu"`` device: on the stand-in device here (``helpers.tpu_standin``: host
memory, operators on the CPU, a ``"tpu"`` process group that reduces through gloo), on the real ``torch-tpu`` in the
Cloud TPU VM workflow (``PL_TORCH_TPU_REAL=1``). Each run is compared with the same run on the CPU."""
import subprocess
import sys

import pytest
import torch

from helpers.runif import RunIf
from helpers.torch_tpu_runs import run, run_script
from helpers.xla_subprocess import subprocess_env

# a BoringModel fit on `accelerator`, its weights and what the Trainer chose
FIT = """
import torch
import pytorch_lightning as pl
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset


# in one process, the order in which the DistributedSampler of a 2-process fit (shuffled, with the seed of
# seed_everything) deals the samples out: with a batch of 2, batch k holds what each process trains at step k
class Dealt(torch.utils.data.Sampler):
    def __init__(self, n, seed):
        self.n, self.seed, self.epoch = n, seed, 0

    def __iter__(self):
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        self.epoch += 1
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self):
        return self.n


class Model(BoringModel):
    def __init__(self, batch_size=1):
        super().__init__()
        self.dtypes = {}
        self.batch_size = batch_size

    def train_dataloader(self):
        sampler = Dealt(len(self._train_data), seed=7) if self.batch_size == 2 else None
        return torch.utils.data.DataLoader(self._train_data, batch_size=self.batch_size, sampler=sampler)

    def training_step(self, batch, batch_idx):
        out = self.layer(batch)
        self.dtypes.setdefault("linear", str(out.dtype))
        loss = torch.nn.functional.cross_entropy(out, torch.zeros(len(out), dtype=torch.long, device=out.device))
        self.dtypes.setdefault("cross_entropy", str(loss.dtype))
        self.dtypes.setdefault("device", str(out.device.type))
        return loss


def fit(accelerator, devices=1, precision=32, max_epochs=2, ckpt_path=None, root="run", batch_size=1, **kwargs):
    pl.seed_everything(7)
    model = Model(batch_size)
    model._train_data = RandomDataset(32, 64)
    trainer = pl.Trainer(accelerator=accelerator, devices=devices, precision=precision, max_epochs=max_epochs,
                         limit_train_batches=4, limit_val_batches=2, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root, **kwargs)
    trainer.fit(model, ckpt_path=ckpt_path)
    return {
        "weights": {k: v.detach().cpu().tolist() for k, v in model.state_dict().items()},
        "accelerator": type(trainer.accelerator).__name__,
        "strategy": type(trainer.strategy).__name__,
        "device": str(trainer.strategy.root_device),
        "precision_plugin": type(trainer.precision_plugin).__name__,
        "checkpoint_io": type(trainer.strategy.checkpoint_io).__name__,
        "dtypes": model.dtypes,
        "best": trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else None,
        "global_step": trainer.global_step,
    }
"""


def _close(a, b, atol=1e-6):
    return all(torch.allclose(torch.tensor(a[k]), torch.tensor(b[k]), atol=atol) for k in a) and a.keys() == b.keys()


@RunIf(torch_tpu=True)
def test_a_fit_on_one_tpu_device_trains_as_on_the_cpu_and_saves_host_copies(tmp_path):
    result = run(tmp_path, FIT + """
# main
tpu = fit("tpu", root="tpu")
cpu = fit("cpu", root="cpu")
saved = torch.load(tpu["best"])  # plain torch.load: weights only, no map_location
tpu["saved_devices"] = sorted({v.device.type for v in saved["state_dict"].values()})
tpu["saved"] = {k: v.tolist() for k, v in saved["state_dict"].items()}
resumed = fit("tpu", max_epochs=3, ckpt_path=tpu["best"], root="tpu")
emit({"tpu": tpu, "cpu": cpu, "resumed": resumed, "longer": fit("tpu", max_epochs=3, root="longer")})
""")
    tpu, cpu = result["tpu"], result["cpu"]
    assert (tpu["accelerator"], tpu["strategy"], tpu["device"]) == ("TorchTPUAccelerator", "SingleDeviceStrategy", "tpu:0")
    assert tpu["dtypes"]["device"] == "tpu" and cpu["dtypes"]["device"] == "cpu"
    assert tpu["checkpoint_io"] == "TorchTPUCheckpointIO"
    assert _close(tpu["weights"], cpu["weights"])
    # the file holds host tensors, the weights of the end of the run
    assert tpu["saved_devices"] == ["cpu"] and _close(tpu["saved"], tpu["weights"], atol=0)
    # the checkpoint of the last epoch resumes into a third one, as a run of three epochs trains
    assert result["resumed"]["global_step"] == result["longer"]["global_step"] == 12
    assert _close(result["resumed"]["weights"], result["longer"]["weights"])


@RunIf(torch_tpu=True)
def test_bf16_mixed_runs_matrix_products_in_bfloat16_through_tpu_autocast(tmp_path):
    result = run(tmp_path, FIT + """
# main
emit({"tpu": fit("tpu", precision="bf16-mixed", root="tpu"), "cpu": fit("cpu", precision="bf16-mixed", root="cpu"),
      "f32": fit("tpu", root="f32")})
""")
    tpu, cpu, f32 = result["tpu"], result["cpu"], result["f32"]
    assert tpu["precision_plugin"] == "NativeMixedPrecisionPlugin"
    # the linear layer in bfloat16, the loss in float32: torch.autocast("tpu") did it, not the module's dtype
    assert tpu["dtypes"] == {"linear": "torch.bfloat16", "cross_entropy": "torch.float32", "device": "tpu"}
    assert f32["dtypes"]["linear"] == "torch.float32"
    # the weights stay float32 and train as under bf16 autocast on the CPU, to bfloat16's precision (the two
    # autocasts may cast a different set of operators), and not as in float32
    assert _close(tpu["weights"], cpu["weights"], atol=2e-3)
    assert not _close(tpu["weights"], f32["weights"], atol=1e-6)


@RunIf(torch_tpu=True)
def test_ddp_over_two_processes_trains_as_one_process_on_the_whole_batch(tmp_path):
    """DDP averages the two processes' gradients: each process trains one sample a step (the sampler deals them out in
    turn), as one process trains both. The reference is a single CPU process with a batch of 2 in the order the
    distributed sampler deals the samples out: 1.8.6's ``ddp_spawn``
    on the CPU is no reference, since its processes share the parameters' memory (``torch.multiprocessing`` sends CPU
    tensors as shared memory) and each applies the averaged step to them, twice the step in all."""
    result = run(tmp_path, FIT + """
# main
emit({"tpu": fit("tpu", devices=2, root="tpu"), "cpu": fit("cpu", devices=1, batch_size=2, root="cpu"),
      "one": fit("tpu", devices=1, root="one")})
""", devices=2, timeout=900)
    tpu, cpu = result["tpu"], result["cpu"]
    assert (tpu["accelerator"], tpu["strategy"]) == ("TorchTPUAccelerator", "DDPSpawnStrategy")
    assert cpu["global_step"] == 8  # the spawned processes keep their step count; their weights come back
    assert _close(tpu["weights"], cpu["weights"], atol=1e-5)
    # and not as one process trains its own samples alone
    assert not _close(tpu["weights"], result["one"]["weights"], atol=1e-3)


@RunIf(torch_tpu=True)
def test_accelerator_tpu_chooses_torch_tpu_and_refuses_what_it_cannot_run(tmp_path):
    result = run(tmp_path, """
import pytorch_lightning as pl
from lightning_lite import LightningLite


def error(**kwargs):
    try:
        pl.Trainer(logger=False, **kwargs)
    except Exception as err:  # noqa: BLE001 - the message is what is checked
        return f"{type(err).__name__}: {err}"
    return None


class Lite(LightningLite):
    def run(self):
        return str(self.device), type(self._accelerator).__name__


# main
emit({
    "tpu": type(pl.Trainer(accelerator="tpu", logger=False).accelerator).__name__,
    "auto": type(pl.Trainer(accelerator="auto", logger=False).accelerator).__name__,
    "named": type(pl.Trainer(accelerator="torch_tpu", logger=False).accelerator).__name__,
    "fp16": error(accelerator="tpu", precision=16),
    "fork": error(accelerator="tpu", devices=2, strategy="ddp_fork"),
    "too_many": error(accelerator="tpu", devices=3),
    "lite": Lite(accelerator="tpu", devices=1).run(),
})
""", devices=2)
    assert result["tpu"] == result["auto"] == result["named"] == "TorchTPUAccelerator"
    assert "precision='bf16-mixed'" in result["fp16"]
    assert "refuses forked processes" in result["fork"] and "ddp_spawn" in result["fork"]
    assert "asks for TPU devices [0, 1, 2], and this process sees 2" in result["too_many"]
    assert result["lite"] == ["tpu:0", "TorchTPUAccelerator"]


def _torch_tpu_registers_nothing_reason():
    from helpers.runif import torch_tpu_reason
    import importlib.util

    reason = torch_tpu_reason()
    if reason:
        return reason
    if importlib.util.find_spec("torch_tpu") is None:
        return "torch-tpu is not installed (make test STACK=torchtpu installs it)"
    if torch.accelerator.is_available() and getattr(torch.accelerator.current_accelerator(), "type", "") == "tpu":
        return "this host has a TPU: torch-tpu registers its device"
    return None


@pytest.mark.skipif(bool(_torch_tpu_registers_nothing_reason()), reason=str(_torch_tpu_registers_nothing_reason()))
def test_with_the_real_torch_tpu_and_no_chip_the_cpu_trains_and_tpu_says_why_not(tmp_path):
    """The real ``torch-tpu`` 0.2.0 wheel, installed on a host without a TPU (its loader on, as users run it): the
    CPU Trainer works, and ``accelerator="tpu"`` refuses with the reason and what to do."""
    code = FIT + """
result = {"cpu": fit("cpu", root="cpu")["global_step"], "torch_tpu_loaded": hasattr(torch, "tpu")}
try:
    fit("tpu", root="tpu")
except Exception as err:
    result["tpu"] = f"{type(err).__name__}: {err}"
print("@@" + __import__("json").dumps(result))
"""
    proc = subprocess.run([sys.executable, "-c", code], env=subprocess_env({"TORCH_DEVICE_BACKEND_AUTOLOAD": None}),
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    result = json.loads(proc.stdout.rsplit("@@", 1)[1])
    assert result["torch_tpu_loaded"] and result["cpu"] == 8
    assert result["tpu"].startswith("MisconfigurationException: `torch-tpu` is installed, but torch reports no TPU")
    assert "accelerator='cpu'" in result["tpu"] and "torch.accelerator.is_available()` is False" in result["tpu"]
