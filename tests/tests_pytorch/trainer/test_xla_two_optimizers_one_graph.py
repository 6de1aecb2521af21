"""Several optimizers in automatic optimization on XLA: one graph and one device-to-host transfer per batch.

The module is shaped like upstream's GAN example (``examples/pl_domain_templates/generative_adversarial_net.py``):
a generator and a discriminator, one Adam optimizer each, ``training_step(batch, batch_idx, optimizer_idx)`` and
both losses logged to the progress bar. Counts are taken on a real XLA device in the steady state.
"""
import pytest
import torch
import torch.nn.functional as F

from helpers.runif import RunIf
from helpers.xla_metrics import XLACounters
from helpers.xla_recording import fit_on_xla, model_class, recorder  # noqa: F401 (fixture)

FIXED_BY = "0059-xla-one-graph-per-batch-with-several-optimizers.patch"

BATCHES = 16
WARM_UP = 6
LATENT, IMAGE = 8, 12


def _loader():
    """Batches of (real images, noise): the noise is drawn on the host so that every run sees the same."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(8, IMAGE, generator=g) * 2 - 1, torch.randn(8, LATENT, generator=g)) for _ in range(BATCHES)]
    return torch.utils.data.DataLoader(batches, batch_size=None)


def _nets():
    torch.manual_seed(0)
    generator = torch.nn.Sequential(
        torch.nn.Linear(LATENT, 16, bias=False), torch.nn.BatchNorm1d(16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, IMAGE),
        torch.nn.Tanh(),
    )
    discriminator = torch.nn.Sequential(torch.nn.Linear(IMAGE, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
    return generator, discriminator


def _losses(module, batch, optimizer_idx):
    imgs, z = batch
    ones, zeros = torch.ones(len(imgs), 1, device=imgs.device), torch.zeros(len(imgs), 1, device=imgs.device)
    if optimizer_idx == 0:
        return F.binary_cross_entropy_with_logits(module.discriminator(module.generator(z)), ones)
    real = F.binary_cross_entropy_with_logits(module.discriminator(imgs), ones)
    fake = F.binary_cross_entropy_with_logits(module.discriminator(module.generator(z).detach()), zeros)
    return (real + fake) / 2


def _gan(frequencies=None, manual=False):
    from pytorch_lightning import LightningModule

    class GAN(LightningModule):
        def __init__(self):
            super().__init__()
            self.generator, self.discriminator = _nets()

        def training_step(self, batch, batch_idx, optimizer_idx):
            loss = _losses(self, batch, optimizer_idx)
            self.log(("g_loss", "d_loss")[optimizer_idx], loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            opt_g = torch.optim.Adam(self.generator.parameters(), lr=0.01, betas=(0.5, 0.999))
            opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=0.01, betas=(0.5, 0.999))
            if frequencies:
                return [{"optimizer": opt, "frequency": f} for opt, f in zip((opt_g, opt_d), frequencies)]
            return [opt_g, opt_d]

        def train_dataloader(self):
            return _loader()

    class ManualGAN(GAN):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            # what automatic optimization does, spelled out: toggle, forward, zero_grad, backward, step
            for idx, opt in enumerate(self.optimizers()):
                self.toggle_optimizer(opt, idx)
                loss = _losses(self, batch, idx)
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
                self.untoggle_optimizer(idx)
                self.log(("g_loss", "d_loss")[idx], loss, prog_bar=True)

    return ManualGAN() if manual else GAN()


def _fit(tmp_path, module, accelerator="tpu", **trainer_kwargs):
    """Fit one epoch; (compiles, executions, transfers) per batch after ``WARM_UP`` on XLA, and the final weights.

    The progress bar is on and reads the running loss and both logged losses at every batch."""
    from pytorch_lightning import Callback, Trainer

    seen = {}
    counters = XLACounters()

    def counts():
        return counters.compiles(), counters.executions(), counters.transfers()

    class Count(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if accelerator == "tpu" and batch_idx == WARM_UP:
                seen["start"] = counts()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if accelerator == "tpu" and batch_idx == BATCHES - 1:
                seen["per_batch"] = tuple((b - a) / (BATCHES - WARM_UP) for a, b in zip(seen["start"], counts()))

    trainer = Trainer(accelerator=accelerator, devices=1, max_epochs=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, callbacks=[Count()], **trainer_kwargs)
    trainer.fit(module)
    weights = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    return seen.get("per_batch"), weights, trainer


@pytest.mark.parametrize(
    "trainer_kwargs",
    [{}, {"gradient_clip_val": 0.5}, {"accumulate_grad_batches": 2}],
    ids=["plain", "gradient-clipping", "accumulate-2"],
)
@RunIf(xla=True)
def test_two_optimizers_run_one_graph_and_one_transfer_per_batch(tmp_path, trainer_kwargs):
    """Before: a barrier after each optimizer's step, and each optimizer's loss read for the running loss right
    after it: 2 graphs and 2 transfers per batch (1 graph and 1 transfer with each optimizer's own backward when
    accumulating: 2 graphs per accumulating batch)."""
    per_batch, _, trainer = _fit(tmp_path, _gan(), **trainer_kwargs)
    assert per_batch == (0.0, 1.0, 1.0)
    # both losses and the running loss reached the host and the progress bar
    metrics = trainer.progress_bar_metrics
    assert {"g_loss", "d_loss"} <= set(metrics), metrics
    assert trainer.fit_loop.running_loss.mean() is not None


@RunIf(xla=True)
def test_two_optimizers_compute_what_manual_optimization_computes(tmp_path):
    """The same operations, in one graph per batch as manual optimization runs them: the weights are bit-identical
    to a manual-optimization run of the same step. (With a barrier after each optimizer, XLA compiled two graphs
    whose fusions round differently: up to 3e-8 apart here after 16 batches.)"""
    _, automatic, _ = _fit(tmp_path / "automatic", _gan())
    manual_counts, manual, _ = _fit(tmp_path / "manual", _gan(manual=True))
    assert manual_counts[:2] == (0.0, 1.0) and manual_counts[2] <= 1, manual_counts
    assert automatic.keys() == manual.keys()
    differ = {k: (automatic[k].double() - manual[k].double()).abs().max().item() for k in automatic
              if not torch.equal(automatic[k], manual[k])}
    assert not differ, differ


@pytest.mark.guard
@RunIf(xla=True)
def test_two_optimizers_on_xla_compute_what_the_cpu_computes(tmp_path):
    """The fix moves barriers only: the XLA run still follows a CPU run of the same module closely."""
    _, xla, _ = _fit(tmp_path / "xla", _gan())
    _, cpu, _ = _fit(tmp_path / "cpu", _gan(), accelerator="cpu")
    # not `running_var`: torch_xla's batch norm updates it with the biased variance, PyTorch's with the unbiased one
    for key in (k for k in cpu if not k.endswith("running_var")):
        torch.testing.assert_close(xla[key], cpu[key], rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.guard
@RunIf(xla=True)
def test_optimizer_frequencies_stay_one_graph_per_batch(tmp_path):
    """With ``frequency`` a batch steps one of the two optimizers: one graph and one transfer, before and after."""
    per_batch, _, trainer = _fit(tmp_path, _gan(frequencies=(1, 2)))
    assert per_batch == (0.0, 1.0, 1.0)
    assert trainer.global_step == BATCHES


@RunIf(xla=True)
def test_one_barrier_after_both_optimizer_steps(tmp_path, recorder):
    """Both optimizers' closures and steps come first, then the batch's single barrier (before: a barrier after each
    optimizer's step)."""
    fit_on_xla(model_class(recorder, n_optimizers=2)(), tmp_path, max_steps=1)
    one_batch = [
        ("training_step", "opt0"), ("zero_grad", "opt0"), ("backward", ""), ("reduce", "opt0"), ("step", "opt0"),
        ("training_step", "opt1"), ("zero_grad", "opt1"), ("backward", ""), ("reduce", "opt1"), ("step", "opt1"),
        ("mark_step", ""),
    ]
    assert recorder.events == one_batch
