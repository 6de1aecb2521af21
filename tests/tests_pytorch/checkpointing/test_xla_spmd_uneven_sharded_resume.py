"""A sharded checkpoint resumes a model whose dimensions the devices do not divide.

Under ``xla_spmd_fsdp`` on 4 devices a ``Linear(30, 6)`` is split with padding (30 and 6 over 4). torch_xla gives no
shard indices for such a tensor, and reading a sharded checkpoint into it failed with ``TypeError: 'ellipsis' object
is not iterable`` inside torch_xla's load planner: a model with a 10-way classifier, or GPT-2's vocabulary of 50257,
could save sharded checkpoints but never resume from them.
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0078-feature-xla-spmd-sharded-checkpoints-of-uneven-shards.patch"

RUN = """
import torch
import torch_xla
from pytorch_lightning import Callback, Trainer
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from pytorch_lightning.strategies import XLASPMDFSDPStrategy


class Uneven(BoringModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 30), torch.nn.ReLU(), torch.nn.Linear(30, 6),
                                         torch.nn.ReLU(), torch.nn.Linear(6, 3))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)

    def train_dataloader(self):
        torch.manual_seed(1)
        return torch.utils.data.DataLoader(RandomDataset(32, 128), batch_size=8)


class Record(Callback):
    '''The parameters and how they and Adam's moments are sharded, at the end of training (before the teardown
    moves them to the CPU).'''

    def on_train_end(self, trainer, pl_module):
        spec = torch_xla._XLAC._get_xla_sharding_spec
        state = trainer.optimizers[0].state
        self.record = {
            "weights": {n: p.detach().cpu().flatten().tolist() for n, p in pl_module.named_parameters()},
            "params": sorted(f"{n}:{spec(p)}" for n, p in pl_module.named_parameters()),
            "state": sorted(f"{k}:{spec(v)}" for s in state.values() for k, v in s.items() if v.dim()),
        }


def fit(folder, max_steps, ckpt_path=None):
    record = Record()
    trainer = Trainer(accelerator="tpu", strategy=XLASPMDFSDPStrategy(state_dict_type="sharded"), max_steps=max_steps,
                      logger=False, enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      callbacks=[ModelCheckpoint(dirpath=folder, save_last=True), record])
    trainer.fit(Uneven(), ckpt_path=ckpt_path)
    return record.record


whole = fit(FOLDER + "/whole", 6)
fit(FOLDER + "/parts", 3)
resumed = fit(FOLDER + "/parts", 6, ckpt_path=FOLDER + "/parts/last.ckpt")
emit({"whole": whole, "resumed": resumed})
"""


@RunIf(xla=True)
def test_a_model_the_devices_do_not_divide_resumes_from_its_sharded_checkpoint(tmp_path, fork_server):
    from helpers.xla_subprocess import run_python

    code = f"FOLDER = {str(tmp_path)!r}\n" + RUN
    result = run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=300, fork_server=fork_server)
    whole, resumed = result["whole"], result["resumed"]
    # the layers are split over the 4 devices, unevenly
    assert all("devices=[" in spec for spec in whole["params"])
    # the resumed run ends where the uninterrupted one did, its parameters and Adam's moments sharded as they were
    assert resumed["weights"] == whole["weights"]
    assert resumed["params"] == whole["params"]
    assert resumed["state"] == whole["state"]
