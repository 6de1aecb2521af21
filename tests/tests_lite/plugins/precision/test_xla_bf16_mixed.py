"""``LightningLite(precision="bf16-mixed")`` computes the forward with bfloat16 autocast on XLA and keeps the
parameters, gradients and optimizer state in float32 (``helpers/xla_bf16_mixed_runs.py``: one XLA device, and
``xla_spmd`` and ``xla_spmd_fsdp`` on 4 XLA:CPU devices). Before, the value was refused."""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0075-feature-xla-bf16-mixed-precision.patch"

FLOAT32 = ["torch.float32"]


def _run(computed_once, fork_server, strategy, precision):
    from helpers.xla_subprocess import run_python

    env = {"PJRT_DEVICE": "CPU", **({"CPU_NUM_DEVICES": "4"} if strategy else {})}

    def compute(folder):
        code = f"from helpers.xla_bf16_mixed_runs import lite_run\nemit(lite_run({strategy!r}, {precision!r}))"
        return run_python(code, env=env, timeout=300, fork_server=fork_server)

    return computed_once(f"bf16-mixed-lite-{strategy}-{precision}", compute)


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", [None, "xla_spmd", "xla_spmd_fsdp"])
def test_lite_bf16_mixed_multiplies_in_bfloat16_and_keeps_float32_weights(computed_once, fork_server, strategy):
    mixed = _run(computed_once, fork_server, strategy, "bf16-mixed")
    reference = _run(computed_once, fork_server, strategy, 32)
    assert mixed["precision"] == "bf16-mixed"
    assert mixed["dots"] == {"bf16": 3, "f32": 0} and reference["dots"] == {"bf16": 0, "f32": 3}
    # the forward's floating point outputs come back in the default dtype
    assert mixed["logits_dtype"] == "torch.float32"
    for key in ("grad_dtypes", "param_dtypes", "optimizer_state_dtypes"):
        assert mixed[key] == FLOAT32, key
    losses, reference_losses = mixed["losses"], reference["losses"]
    assert max(abs(a - b) for a, b in zip(losses, reference_losses)) < 0.01 and losses != reference_losses
    assert losses[-1] < losses[0] - 0.1


def test_lite_bf16_mixed_is_bf16_autocast_on_the_cpu_and_bf16_true_is_refused_there():
    from lightning_lite import LightningLite
    from lightning_lite.plugins import NativeMixedPrecision

    class Lite(LightningLite):
        def run(self):
            pass

    plugin = Lite(accelerator="cpu", precision="bf16-mixed")._precision
    assert isinstance(plugin, NativeMixedPrecision) and plugin.device == "cpu"
    with pytest.raises(ValueError, match=r"`Lite\(precision='bf16-true'\)` converts the whole model to bfloat16"):
        Lite(accelerator="cpu", precision="bf16-true")


@RunIf(xla=True)
def test_the_trainer_s_bf16_mixed_plugin_given_to_lightning_lite_autocasts_there():
    """``pytorch_lightning.lite.LightningLite`` takes the Trainer's precision plugins and converts them to Lite's:
    the bf16-mixed one had no conversion, and the constructor raised ``TypeError``."""
    import torch

    from lightning_lite.plugins import TPUBf16MixedPrecision
    from pytorch_lightning.lite import LightningLite
    from pytorch_lightning.plugins import TPUBf16MixedPrecisionPlugin

    class Lite(LightningLite):
        def run(self):
            model = self.setup(torch.nn.Linear(4, 4))
            with self.autocast():
                out = model.module(torch.ones(2, 4, device=self.device))
            return out.dtype, model.module.weight.dtype

    lite = Lite(accelerator="tpu", devices=1, plugins=TPUBf16MixedPrecisionPlugin())
    assert type(lite._precision) is TPUBf16MixedPrecision and lite._precision.precision == "bf16-mixed"
    assert lite.run() == (torch.bfloat16, torch.float32)
