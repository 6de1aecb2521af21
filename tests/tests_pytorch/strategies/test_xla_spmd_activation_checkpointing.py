"""``activation_checkpointing_policy`` on the SPMD strategies: the selected layers recompute their activations in the
backward instead of keeping them (torch_xla's ``checkpoint_module``, before the FSDPv2 wrap), with the same gradients
and the plain state dict names.

The runs (``helpers/xla_activation_checkpointing_runs.py``) train a stack of 3 residual blocks on 4 XLA:CPU devices.
The mark of the recomputation is one optimization barrier per checkpointed block in the HLO of the gradients. XLA:CPU
drops optimization barriers when it optimizes (torch_xla's own tests say so): the compiled program there keeps the
activations all the same, so memory is measured on TPUs, not here (docs/precision.md). Before, the argument did not
exist.
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0076-feature-xla-spmd-activation-checkpointing.patch"

LAYERS = 3
BLOCKS = [f"net.blocks.{i}" for i in range(LAYERS)]


@pytest.fixture(scope="module")
def runs(computed_once, fork_server):
    from helpers.xla_subprocess import run_python

    def compute(folder):
        code = f"from helpers.xla_activation_checkpointing_runs import trainer_runs\nemit(trainer_runs({str(folder)!r}))"
        return run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=400,
                          fork_server=fork_server)

    return computed_once("spmd-activation-checkpointing-trainer", compute)


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
def test_the_selected_layers_recompute_with_the_same_gradients(runs, strategy):
    from helpers.xla_activation_checkpointing_runs import max_difference

    plain, checkpointed = runs[f"{strategy}-False"], runs[f"{strategy}-True"]
    assert plain["recomputed"] == [] and plain["barriers"] == 0
    assert checkpointed["recomputed"] == BLOCKS
    # one optimization barrier per block: where the backward recomputes its forward
    assert checkpointed["barriers"] == LAYERS
    assert max_difference(plain["grads"], checkpointed["grads"]) < 1e-6
    # the state dict, and so the checkpoint, keeps the plain model's names; the checkpoint loads into it
    assert checkpointed["state_dict_keys"] == plain["state_dict_keys"]
    assert not any("_orig_module" in k or "checkpoint" in k for k in checkpointed["state_dict_keys"])
    assert checkpointed["loads_into_the_plain_model"]


@RunIf(xla=True)
def test_wrapped_blocks_are_checkpointed_inside_their_fsdp_wrapper_under_bf16_mixed(runs):
    """The large-model setup: FSDPv2 wraps each block (``auto_wrap_policy``), autocast multiplies in bfloat16."""
    from helpers.xla_activation_checkpointing_runs import max_difference

    plain, checkpointed = runs["wrapped-bf16-mixed-False"], runs["wrapped-bf16-mixed-True"]
    # the checkpoint is applied to the block, which the wrapper then holds, as torch_xla requires
    assert checkpointed["recomputed"] == [f"{block}._orig_module" for block in BLOCKS]
    # the wrappers' own barriers, and one more per checkpointed block
    assert checkpointed["barriers"] == plain["barriers"] + LAYERS
    # bfloat16 products in another order: close, not equal
    assert max_difference(plain["grads"], checkpointed["grads"]) < 1e-3
    assert checkpointed["state_dict_keys"] == plain["state_dict_keys"] == runs["xla_spmd-False"]["state_dict_keys"]
    assert checkpointed["loads_into_the_plain_model"]


@pytest.mark.parametrize("policy", [{"Block"}, [], 3, object])
def test_a_policy_that_is_not_one_is_refused(policy):
    from pytorch_lightning.strategies import XLASPMDFSDPStrategy
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    pytest.importorskip("torch_xla")
    with pytest.raises(MisconfigurationException, match="is not a policy: give the set of layer classes"):
        XLASPMDFSDPStrategy(activation_checkpointing_policy=policy)


@RunIf(xla=True)
def test_a_policy_that_selects_nothing_is_refused():
    import torch

    from lightning_lite.strategies.xla_spmd import _check_activation_checkpointing_policy, _checkpoint_activations
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    policy = _check_activation_checkpointing_policy({torch.nn.Conv2d})
    with pytest.raises(MisconfigurationException, match="selects no submodule of `Sequential`: name the classes"):
        _checkpoint_activations(torch.nn.Sequential(torch.nn.Linear(2, 2)), policy)
