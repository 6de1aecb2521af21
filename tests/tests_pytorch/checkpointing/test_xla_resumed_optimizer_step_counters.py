"""A resumed run's steps cost what the first run's did: the optimizer's step counters stay on the host.

torch's Adam keeps each parameter's ``step`` counter on the CPU (unless ``capturable`` or ``fused``) and reads it on
the host every step. Loading a checkpoint moved the whole optimizer state to the device, counters included, so every
step of a resumed run on XLA ran one extra graph and made one extra copy to the host per parameter: found by the
graph report in ``examples/llama_xla.py`` resumed from a sharded checkpoint (21 parameters: 22 graphs a step).
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0077-optimizer-step-counters-stay-on-the-host.patch"

RUN = """
import torch
from pytorch_lightning import Trainer, Callback
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset
from pytorch_lightning.strategies import XLASPMDFSDPStrategy
from helpers.xla_metrics import XLACounters


class Adam(BoringModel):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(RandomDataset(32, 128), batch_size=8)


class Count(Callback):
    '''Graphs and transfers of the steady steps: from the start of this `fit`'s third batch to the start of its last
    (the save at the end of `fit` is left out).'''

    def __init__(self):
        self.starts, self.devices = [], None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.starts.append((XLACounters.get("ExecuteTime") + XLACounters.get("ExecuteReplicatedTime"),
                            XLACounters.get("TransferFromDeviceTime")))
        if len(self.starts) == 3:
            state = trainer.optimizers[0].state
            self.devices = sorted({f"{k}:{v.device.type}" for s in state.values() for k, v in s.items()})

    @property
    def counts(self):
        steady = len(self.starts) - 3
        return [(b - a) / steady for a, b in zip(self.starts[2], self.starts[-1])]


def fit(max_steps, ckpt_path=None):
    strategy = XLASPMDFSDPStrategy(state_dict_type="sharded") if SPMD else None
    count = Count()
    kwargs = dict(devices=1) if not SPMD else {}
    trainer = Trainer(accelerator="tpu", strategy=strategy, max_steps=max_steps, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      callbacks=[count, ModelCheckpoint(dirpath=FOLDER, save_last=True)], **kwargs)
    trainer.fit(Adam(), ckpt_path=ckpt_path)
    return {"counts": count.counts, "devices": count.devices}


first = fit(6)
resumed = fit(12, ckpt_path=FOLDER + "/last.ckpt")
emit({"first": first, "resumed": resumed})
"""

CASES = {
    "one device, full checkpoint": ({"PJRT_DEVICE": "CPU"}, False),
    "xla_spmd_fsdp, sharded checkpoint": ({"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, True),
}


@RunIf(xla=True)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_resumed_run_keeps_adams_step_counters_on_the_host(tmp_path, fork_server, case):
    from helpers.xla_subprocess import run_python

    env, spmd = CASES[case]
    code = f"SPMD = {spmd!r}\nFOLDER = {str(tmp_path)!r}\n" + RUN
    result = run_python(code, env=env, timeout=300, fork_server=fork_server)
    first, resumed = result["first"], result["resumed"]
    # one graph a step and its one copy of the logged values, in the first run and in the resumed one alike
    assert first["counts"] == [1.0, 1.0]
    assert resumed["counts"] == first["counts"]
    # the moments on the device, the counters where torch's Adam made them
    assert first["devices"] == ["exp_avg:xla", "exp_avg_sq:xla", "step:cpu"]
    assert resumed["devices"] == first["devices"]


def test_counters_stay_unless_the_group_keeps_them_on_the_device():
    """The rule, on the CPU: what ``_optimizer_to_device`` leaves and what it moves (a ``meta`` device stands for the
    accelerator)."""
    import torch

    from lightning_lite.utilities.optimizer import _optimizer_to_device

    def stepped():
        layer = torch.nn.Linear(4, 2)
        optimizer = torch.optim.Adam(layer.parameters(), lr=0.1)
        layer(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        return optimizer

    plain = stepped()
    plain.state["custom"] = {"count": torch.tensor(1.0)}
    _optimizer_to_device(plain, "meta")
    for param in plain.param_groups[0]["params"]:
        state = plain.state[param]
        assert state["step"].device.type == "cpu"
        assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"
    # state that holds no step counter moves whole, as before
    assert plain.state["custom"]["count"].device.type == "meta"

    capturable = stepped()
    # torch steps a capturable Adam on accelerators only; the flag is what the rule reads
    capturable.param_groups[0]["capturable"] = True
    _optimizer_to_device(capturable, "meta")
    assert {s["step"].device.type for s in capturable.state.values()} == {"meta"}
