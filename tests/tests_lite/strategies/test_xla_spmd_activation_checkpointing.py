"""``LightningLite`` with ``activation_checkpointing_policy`` on the SPMD strategies: the selected blocks recompute
their forward in the backward (one optimization barrier each in the HLO of the gradients), the gradients are those of
the run without it, and the state dict keeps the plain names (``helpers/xla_activation_checkpointing_runs.py``, 4
XLA:CPU devices)."""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0076-feature-xla-spmd-activation-checkpointing.patch"


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
def test_lite_checkpointed_blocks_recompute_with_the_same_gradients(computed_once, fork_server, strategy):
    from helpers.xla_activation_checkpointing_runs import max_difference
    from helpers.xla_subprocess import run_python

    def compute(folder):
        code = ("from helpers.xla_activation_checkpointing_runs import lite_run\n"
                f"emit({{'plain': lite_run({strategy!r}, False), 'checkpointed': lite_run({strategy!r}, True)}})")
        return run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=300,
                          fork_server=fork_server)

    runs = computed_once(f"spmd-activation-checkpointing-lite-{strategy}", compute)
    plain, checkpointed = runs["plain"], runs["checkpointed"]
    assert (plain["barriers"], checkpointed["barriers"]) == (0, 3)
    assert max_difference(plain["grads"], checkpointed["grads"]) < 1e-6
    assert checkpointed["state_dict_keys"] == plain["state_dict_keys"]
