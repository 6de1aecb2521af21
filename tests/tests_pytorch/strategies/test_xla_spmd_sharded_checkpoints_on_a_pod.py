"""Sharded SPMD checkpoints are refused on several hosts until the hosts save them together.

With several processes (a pod), each host would number and commit its own version of a sharded checkpoint and then
remove the other versions, which can remove another host's save while it is written. Until one version is chosen by
process 0 and committed after every host finished, ``state_dict_type="sharded"`` with more than one process stops
before training, and a save refuses too. The process count is the one query of the runtime that is stood in for here:
XLA:CPU runs one process per host.
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0053-feature-xla-spmd-sharded-checkpoints.patch"


@pytest.fixture
def two_hosts(monkeypatch):
    import pytorch_lightning.strategies.xla_spmd as xla_spmd

    monkeypatch.setattr(xla_spmd, "_process_count", lambda: 2)


@RunIf(xla=True)
def test_sharded_checkpoints_on_several_hosts_are_refused_before_training(two_hosts, tmp_path):
    from pytorch_lightning.strategies import XLASPMDStrategy
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    strategy = XLASPMDStrategy(state_dict_type="sharded")
    with pytest.raises(MisconfigurationException, match="this run has 2 processes.*`state_dict_type='full'`"):
        strategy.setup(trainer=None)
    with pytest.raises(MisconfigurationException, match="runs on one host only"):
        strategy.save_checkpoint({"state_dict": {}}, tmp_path / "last.ckpt")
    assert list(tmp_path.iterdir()) == []


@RunIf(xla=True)
def test_full_checkpoints_on_several_hosts_are_not_refused(two_hosts):
    from pytorch_lightning.strategies import XLASPMDStrategy

    strategy = XLASPMDStrategy(state_dict_type="full")
    # the check passes; the setup then needs its Trainer
    with pytest.raises(AssertionError):
        strategy.setup(trainer=None)
