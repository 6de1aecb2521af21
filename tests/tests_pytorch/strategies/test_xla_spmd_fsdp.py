"""The Trainer's FSDPv2 strategy, ``strategy="xla_spmd_fsdp"``, on 4 XLA:CPU devices driven by one process. The
runs and checks it shares with data parallel are parametrized over both strategies in ``test_xla_spmd.py`` (the runs
through ``helpers/xla_spmd_fixtures.py``); here is what only FSDPv2 does: the sharding of the parameters and of the
optimizer state, and an auto-wrap policy."""
import pytest

from helpers.runif import RunIf
from helpers.xla_spmd_checks import DEVICES, max_difference, TOLERANCE

FIXED_BY = "0051-feature-xla-spmd-fsdp-strategy.patch"
STRATEGY = "xla_spmd_fsdp"


@RunIf(xla=True)
def test_fsdp_shards_parameters_and_optimizer_state_over_the_4_devices(spmd_runs):
    """FSDPv2: each parameter is split 4 ways along its largest dimension; its momentum / Adam state follows."""
    run = spmd_runs(STRATEGY)["runs"]["manual"]
    expected = {
        # Linear(16, 32): weight (32, 16) split along the 32 rows, bias (32,)
        "net.0.weight": ("{devices=[4,1]0,1,2,3}", [8, 16]),
        "net.0.bias": ("{devices=[4]0,1,2,3}", [8]),
        # Linear(32, 4): weight (4, 32) split along the 32 columns, bias (4,) one value per device
        "net.2.weight": ("{devices=[1,4]0,1,2,3}", [4, 8]),
        "net.2.bias": ("{devices=[4]0,1,2,3}", [1]),
    }
    assert {n: (i["spec"], i["shards"]) for n, i in run["sharding"].items()} == {
        n: (spec, [shard] * DEVICES) for n, (spec, shard) in expected.items()
    }
    # SGD momentum for net.0, Adam's two moments for net.2: each sharded like its parameter
    assert sorted(s["key"] for s in run["optimizer_state"]) == ["exp_avg", "exp_avg", "exp_avg_sq", "exp_avg_sq",
                                                                "momentum_buffer", "momentum_buffer"]
    assert all(s["spec"] == s["param_spec"] != "{replicated}" for s in run["optimizer_state"])
    # a quarter of the bytes of data parallel's parameters and state on each device
    dp = spmd_runs("xla_spmd")["runs"]["manual"]["bytes_device0"]
    assert run["bytes_device0"] == dp // DEVICES


@RunIf(xla=True)
def test_fsdp_auto_wrap_policy(spmd_one_device, spmd_runs):
    """With an auto-wrap policy that selects the ``Linear`` layers, both are wrapped in torch_xla's
    ``SpmdFullyShardedDataParallel``; training still equals one device, and the checkpoint keeps the plain names."""
    import torch

    run = spmd_runs(STRATEGY)["runs"]["autowrap"]
    assert run["wrapped"] == ["net.0", "net.2"]
    assert spmd_runs(STRATEGY)["runs"]["clip"]["wrapped"] == []
    assert max_difference(spmd_one_device["runs"]["clip"]["weights"], run["weights"]) < TOLERANCE
    state = torch.load(run["checkpoint"], map_location="cpu", weights_only=False)["state_dict"]
    assert sorted(state) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
    assert {n: i["spec"] for n, i in run["sharding"].items()} == {
        n: i["spec"] for n, i in spmd_runs(STRATEGY)["runs"]["clip"]["sharding"].items()
    }


def test_fsdp_needs_an_fsdp_axis():
    pytest.importorskip("torch_xla")
    from pytorch_lightning.strategies import StrategyRegistry, XLASPMDFSDPStrategy
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="axis named 'fsdp'"):
        XLASPMDFSDPStrategy(axis_names=("data",))
    strategy = XLASPMDFSDPStrategy(mesh_shape=(2, 2), axis_names=("data", "fsdp"))
    assert strategy.batch_axes == ("data", "fsdp")
    assert XLASPMDFSDPStrategy().axis_names == ("fsdp",)
    assert isinstance(StrategyRegistry.get("xla_spmd_fsdp"), XLASPMDFSDPStrategy)
