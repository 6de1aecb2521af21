"""``precision="bf16-mixed"`` trains with bfloat16 autocast on XLA, as large models train on TPUs: the step's matrix
products run in bfloat16 while the parameters, their gradients, the optimizer state and the checkpoints stay float32.

Each run (``helpers/xla_bf16_mixed_runs.py``) trains a small classifier with Adam in a process of its own: on one
XLA device, with two ``tpu_spawn`` processes through the test harness, and under ``xla_spmd`` and ``xla_spmd_fsdp``
on 4 XLA:CPU devices. Before, ``precision="bf16-mixed"`` was refused: only ``"bf16"``, which converts the whole model
(parameters and optimizer state included) to bfloat16.
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0075-feature-xla-bf16-mixed-precision.patch"

STRATEGIES = ["single", "tpu_spawn", "xla_spmd", "xla_spmd_fsdp"]
ENVS = {
    "single": {"PJRT_DEVICE": "CPU"},
    # two processes through the simulated TPU host of `helpers/gloo_xla_collectives.py`
    "tpu_spawn": {"PJRT_DEVICE": None, "CPU_NUM_DEVICES": None},
    "xla_spmd": {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"},
    "xla_spmd_fsdp": {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"},
}
FLOAT32 = ["torch.float32"]


def _run(computed_once, fork_server, strategy, precision):
    from helpers.xla_subprocess import run_python

    def compute(folder):
        code = ("from helpers.xla_bf16_mixed_runs import trainer_run\n"
                f"emit(trainer_run({strategy!r}, {precision!r}, {str(folder)!r}))")
        return run_python(code, env=ENVS[strategy], timeout=300, fork_server=fork_server)

    return computed_once(f"bf16-mixed-trainer-{strategy}-{precision}", compute)


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bf16_mixed_multiplies_in_bfloat16_and_keeps_float32_weights(computed_once, fork_server, strategy):
    mixed = _run(computed_once, fork_server, strategy, "bf16-mixed")
    reference = _run(computed_once, fork_server, strategy, 32)
    assert mixed["precision"] == "bf16-mixed"
    # the three linear layers' dot products, in the HLO of the step's loss
    assert mixed["dots"] == {"bf16": 3, "f32": 0}
    assert reference["dots"] == {"bf16": 0, "f32": 3}
    assert mixed["logits_dtype"] == mixed["val_logits_dtype"] == "torch.bfloat16"
    # the loss is one of the operations autocast keeps in float32
    assert mixed["loss_dtype"] == "torch.float32"
    for key in ("param_dtypes_in_step", "grad_dtypes", "optimizer_state_dtypes", "param_dtypes",
                "checkpoint_state_dtypes", "checkpoint_optimizer_dtypes"):
        assert mixed[key] == FLOAT32, key
    # the checkpoint loads into a plain float32 model of the same layers
    assert mixed["loaded_dtypes"] == FLOAT32 and mixed["loaded_equal"]
    # the loss tracks the float32 run's, and learns
    losses, reference_losses = mixed["losses"], reference["losses"]
    assert len(losses) == len(reference_losses) == 12
    assert max(abs(a - b) for a, b in zip(losses, reference_losses)) < 0.01
    assert losses != reference_losses
    assert losses[-1] < losses[0] - 0.1


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", ["single", "xla_spmd", "xla_spmd_fsdp"])
def test_bf16_mixed_steady_steps_compile_nothing_and_run_one_graph(computed_once, fork_server, strategy):
    counts = _run(computed_once, fork_server, strategy, "bf16-mixed")["counts"]
    steady = [[b - a for a, b in zip(before, after)] for before, after in zip(counts[2:], counts[3:])]
    assert len(steady) == 9
    assert all(c[0] == 0 and c[1] == 1 and c[2] <= 1 for c in steady), steady


@RunIf(xla=True)
def test_bf16_true_is_what_bf16_does_on_xla():
    from pytorch_lightning import Trainer
    from pytorch_lightning.plugins import TPUBf16MixedPrecisionPlugin, TPUBf16PrecisionPlugin

    assert isinstance(Trainer(accelerator="tpu", devices=1, precision="bf16-true").precision_plugin,
                      TPUBf16PrecisionPlugin)
    assert isinstance(Trainer(accelerator="tpu", devices=1, precision="bf16").precision_plugin, TPUBf16PrecisionPlugin)
    assert type(Trainer(accelerator="tpu", devices=1, precision="bf16-mixed").precision_plugin) is (
        TPUBf16MixedPrecisionPlugin)


def test_bf16_mixed_is_bf16_autocast_on_the_cpu_and_bf16_true_is_refused_there():
    from pytorch_lightning import Trainer
    from pytorch_lightning.plugins import NativeMixedPrecisionPlugin
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    plugin = Trainer(accelerator="cpu", precision="bf16-mixed").precision_plugin
    assert isinstance(plugin, NativeMixedPrecisionPlugin) and plugin.device == "cpu"
    with pytest.raises(MisconfigurationException) as refused:
        Trainer(accelerator="cpu", precision="bf16-true")
    assert str(refused.value) == (
        "`Trainer(precision='bf16-true')` converts the whole model to bfloat16, which is implemented for XLA devices"
        " only, not for the CPUAccelerator. Use `precision='bf16-mixed'` (bfloat16 autocast) instead, or"
        " `accelerator='tpu'`."
    )


@RunIf(xla=True)
def test_bf16_mixed_with_manual_optimization_two_optimizers_and_clipping(tmp_path):
    """Manual optimization: ``manual_backward`` inside ``training_step`` runs inside the autocast region, as upstream's
    autocast on GPUs does; each optimizer's update still reads float32 gradients, clipped, and tracks float32."""
    import torch

    from helpers.xla_recording import fit_on_xla
    from pytorch_lightning import LightningModule, seed_everything

    class TwoOptimizers(LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            torch.manual_seed(0)
            self.encoder, self.head = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
            self.grad_dtypes, self.losses = set(), []

        def training_step(self, batch, batch_idx):
            x, y = batch
            for optimizer in self.optimizers():
                loss = torch.nn.functional.cross_entropy(self.head(torch.tanh(self.encoder(x))), y)
                optimizer.zero_grad()
                self.manual_backward(loss)
                self.grad_dtypes |= {p.grad.dtype for p in self.parameters() if p.grad is not None}
                self.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
                optimizer.step()
            self.losses.append(loss.detach())

        def configure_optimizers(self):
            return (torch.optim.SGD(self.encoder.parameters(), lr=0.1),
                    torch.optim.Adam(self.head.parameters(), lr=0.01))

        def train_dataloader(self):
            g = torch.Generator().manual_seed(1)
            x = torch.randn(128, 16, generator=g)
            return torch.utils.data.DataLoader(list(zip(x, x[:, :4].argmax(dim=1))), batch_size=16)

    runs = {}
    for precision in (32, "bf16-mixed"):
        seed_everything(0)
        module = TwoOptimizers()
        fit_on_xla(module, tmp_path / str(precision), precision=precision, max_epochs=2)
        runs[precision] = module
    mixed, reference = runs["bf16-mixed"], runs[32]
    assert mixed.grad_dtypes == {torch.float32}
    assert {p.dtype for p in mixed.parameters()} == {torch.float32}
    losses, reference_losses = [float(v) for v in mixed.losses], [float(v) for v in reference.losses]
    assert len(losses) == 16 and losses != reference_losses
    # within 5% of the float32 run's loss at every step (bf16 products, SGD at 0.1 amplifies them), and it learns
    assert max(abs(a - b) / b for a, b in zip(losses, reference_losses)) < 0.05, (losses, reference_losses)
    assert losses[-1] < losses[0] - 0.1, losses
