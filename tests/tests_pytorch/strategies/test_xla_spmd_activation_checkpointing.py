"""``activation_checkpointing_policy`` on the SPMD strategies: the selected layers recompute their activations in the
backward instead of keeping them (torch_xla's ``checkpoint_module``, before the FSDPv2 wrap), with the same gradients
and the plain state dict names.

The runs (``helpers/xla_activation_checkpointing_runs.py``) train a stack of 3 residual blocks on 4 XLA:CPU devices.
The mark of the recomputation is one optimization barrier per checkpointed block in the HLO of the gradients. XLA:CPU
drops optimization barriers when it optimizes (torch_xla's own tests say so): the compiled program there keeps the
activations all the same, so memory is measured on TPUs, not here (docs/precision.md). Before, the argument did not
exist.
"""
import copy
from functools import partial

import pytest
import torch

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


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.linear(x)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()
        self.out = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + self.out(torch.relu(self.inner(x)))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))
        self.head = torch.nn.Linear(8, 2)


def _auto_wrap_policies():
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy, transformer_auto_wrap_policy

    return {
        "transformer_auto_wrap_policy": partial(transformer_auto_wrap_policy, transformer_layer_cls={_Block}),
        "ModuleWrapPolicy": ModuleWrapPolicy({_Block}),
        # the innermost modules of at least 100 parameters: each block's two linear layers (72 each) are too small
        # alone, so each block is taken, and the embedding and head never (40 and 18)
        "size_based_auto_wrap_policy": partial(size_based_auto_wrap_policy, min_num_params=100),
        "a function of the auto-wrap arguments": lambda module, recurse, nonwrapped_numel: (
            recurse or isinstance(module, _Inner)
        ),
    }


def _what_lightning_2_checkpoints(model, policy):
    """The outermost submodules that torch's ``apply_activation_checkpointing`` wraps under ``policy``, as Lightning
    2.x's strategies apply an ``activation_checkpointing_policy``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        CheckpointWrapper,
    )

    model = copy.deepcopy(model)
    apply_activation_checkpointing(model, auto_wrap_policy=policy)
    names = [n.replace("._checkpoint_wrapped_module", "") for n, m in model.named_modules()
             if isinstance(m, CheckpointWrapper)]
    return [n for n in names if not any(n.startswith(outer + ".") for outer in names)]


BLOCK_NAMES = [f"blocks.{i}" for i in range(3)]
SELECTED = {
    "transformer_auto_wrap_policy": BLOCK_NAMES,
    "ModuleWrapPolicy": BLOCK_NAMES,
    "size_based_auto_wrap_policy": BLOCK_NAMES,
    "a function of the auto-wrap arguments": [f"{block}.inner" for block in BLOCK_NAMES],
}


@pytest.mark.parametrize("name", list(SELECTED))
def test_an_fsdp_auto_wrap_policy_selects_what_lightning_2_checkpoints(name):
    """Code ported from Lightning 2.x passes an auto-wrap policy, ``policy(module, recurse, nonwrapped_numel)``:
    it selects the submodules torch's ``apply_activation_checkpointing`` would. Before, the strategy called it with
    the submodule alone, and setup failed with a ``TypeError``."""
    from lightning_lite.strategies.xla_spmd import _check_activation_checkpointing_policy

    policy = _auto_wrap_policies()[name]
    model = _Net()
    assert _what_lightning_2_checkpoints(model, policy) == SELECTED[name]
    assert _check_activation_checkpointing_policy(policy)(model) == SELECTED[name]


@RunIf(xla=True)
def test_torch_xla_s_auto_wrap_policy_checkpoints_its_layers_and_a_one_argument_function_is_still_one():
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from lightning_lite.strategies.xla_spmd import _check_activation_checkpointing_policy, _checkpoint_activations

    def checkpointed(policy):
        model = _Net()
        _checkpoint_activations(model, _check_activation_checkpointing_policy(policy))
        return [n for n, m in model.named_modules() if "_xla_checkpointed_forward_original" in vars(m)]

    # torch_xla names the third argument `unwrapped_params`: the arguments are given by position
    assert checkpointed(partial(transformer_auto_wrap_policy, transformer_layer_cls={_Block})) == BLOCK_NAMES
    assert checkpointed(lambda module: isinstance(module, _Inner)) == [f"{b}.inner" for b in BLOCK_NAMES]
    assert checkpointed({_Block}) == BLOCK_NAMES


def test_a_function_of_another_shape_is_refused_with_both_forms_named():
    from lightning_lite.strategies.xla_spmd import _check_activation_checkpointing_policy
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=r"takes neither one submodule nor FSDP's auto-wrap arguments"):
        _check_activation_checkpointing_policy(lambda module, recurse: True)
