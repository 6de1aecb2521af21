"""``LightningLite(strategy="xla_spmd")`` and ``"xla_spmd_fsdp"`` on 4 XLA:CPU devices driven by one process, real SPMD.

The Lite loops run in the same processes as the Trainer's SPMD runs (``helpers/xla_spmd_fixtures.py``): the
reference on one XLA device, each strategy on 4, on the same global batches, 12 steps each: clipping by the norm
with the loss read every step, two batches per update (the first under ``no_backward_sync``), two optimizers.
"""
import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0052-feature-lite-xla-spmd-strategies.patch"

STRATEGIES = pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
SCENARIOS = ("clip", "accumulate", "manual")
DEVICES = 4
TOLERANCE = 1e-5


def _max_difference(a, b):
    assert a.keys() == b.keys()
    return max((torch.tensor(a[k]) - torch.tensor(b[k])).abs().max().item() for k in a)


@STRATEGIES
@RunIf(xla=True)
def test_lite_spmd_reaches_the_one_device_weights(spmd_one_device, spmd_runs, strategy):
    """The same weights and losses as one device: before the optimizer was remapped to the parameters that moving
    the model to the SPMD device creates, SPMD Lite silently trained nothing (0.11 apart after 12 steps)."""
    lite = spmd_runs(strategy)["lite"]
    for scenario in SCENARIOS:
        ref, run = spmd_one_device["lite"][scenario], lite[scenario]
        assert _max_difference(ref["weights"], run["weights"]) < TOLERANCE, scenario
        assert run["losses"] == pytest.approx(ref["losses"], abs=TOLERANCE), scenario
        # it trained: the last loss is not the first
        assert abs(run["losses"][-1] - run["losses"][0]) > 1e-3


@STRATEGIES
@RunIf(xla=True)
def test_lite_spmd_steady_steps_cost_what_one_device_costs(spmd_one_device, spmd_runs, strategy):
    """Per steady batch: no compilation, and the graphs and transfers of one device (1 each with one optimizer, 1 per
    update with accumulation, one per ``optimizer.step`` and ``loss.item()`` with two optimizers)."""
    lite = spmd_runs(strategy)["lite"]
    expected = {
        "clip": {"compiles": 0, "executions": 1, "transfers": 1},
        "accumulate": {"compiles": 0, "executions": 0.5, "transfers": 0.5},
        "manual": {"compiles": 0, "executions": 2, "transfers": 2},
    }
    for scenario in SCENARIOS:
        assert lite[scenario]["train"] == expected[scenario], scenario
        assert spmd_one_device["lite"][scenario]["train"] == expected[scenario], scenario


@STRATEGIES
@RunIf(xla=True)
def test_lite_spmd_sharding(spmd_runs, strategy):
    sharding = spmd_runs(strategy)["lite"]["manual"]["sharding"]
    if strategy == "xla_spmd":
        assert all(i["spec"] == "{replicated}" and i["shards"] == [i["shape"]] * DEVICES for i in sharding.values())
    else:
        assert {n: (i["spec"], i["shards"][0]) for n, i in sharding.items()} == {
            "0.weight": ("{devices=[4,1]0,1,2,3}", [8, 16]),
            "0.bias": ("{devices=[4]0,1,2,3}", [8]),
            "2.weight": ("{devices=[1,4]0,1,2,3}", [4, 8]),
            "2.bias": ("{devices=[4]0,1,2,3}", [1]),
        }


def test_lite_spmd_strategies_are_registered_and_validated():
    pytest.importorskip("torch_xla")
    from lightning_lite.strategies import STRATEGY_REGISTRY, XLASPMDFSDPStrategy, XLASPMDStrategy
    from lightning_lite.utilities.exceptions import MisconfigurationException

    assert isinstance(STRATEGY_REGISTRY.get("xla_spmd"), XLASPMDStrategy)
    assert isinstance(STRATEGY_REGISTRY.get("xla_spmd_fsdp"), XLASPMDFSDPStrategy)
    with pytest.raises(MisconfigurationException, match="axis named 'fsdp'"):
        XLASPMDFSDPStrategy(axis_names=("data",))
    with pytest.raises(MisconfigurationException, match="one name per axis"):
        XLASPMDStrategy(mesh_shape=(2, 2))


def test_lite_spmd_needs_the_tpu_accelerator():
    """Any other accelerator is refused before SPMD is switched on (so this process stays as it was)."""
    pytest.importorskip("torch_xla")
    from lightning_lite import LightningLite
    from lightning_lite.utilities.exceptions import MisconfigurationException

    class Lite(LightningLite):
        def run(self) -> None:
            raise AssertionError("the run must not start")

    with pytest.raises(MisconfigurationException, match="accelerator is `CPUAccelerator`: pass `accelerator='tpu'`"):
        Lite(accelerator="cpu", strategy="xla_spmd_fsdp").run()


_LEAVES_A_PASS_AND_EXITS = """
import sys
import torch
from lightning_lite import LightningLite


class Lite(LightningLite):
    def run(self):
        # 8 MB batches: when the script exits, the loader thread is sharding the next one to the 4 devices
        data = torch.utils.data.TensorDataset(torch.randn(64 * 1024, 2048))
        loader = self.setup_dataloaders(torch.utils.data.DataLoader(data, batch_size=1024))
        passing = iter(loader)
        next(passing), next(passing)
        print("left the pass", flush=True)


Lite(accelerator="tpu", strategy=sys.argv[1]).run()
sys.exit(0)
"""


@STRATEGIES
@RunIf(xla=True)
def test_a_lite_script_that_leaves_a_pass_exits_with_its_own_status(strategy):
    """A Lite script that leaves its loop early and exits, in a real child process on 4 XLA:CPU devices: the loader
    thread that shards the batches ends before the interpreter does. Left running, it is inside torch_xla when the
    interpreter exits, and that aborts the process (``terminate called without an active exception``, status -6),
    every time on this host."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(DEVICES), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _LEAVES_A_PASS_AND_EXITS, strategy], env=env, capture_output=True,
                          text=True, timeout=240)
    assert "left the pass" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr
