"""``precision="bf16-mixed"`` (bfloat16 autocast, float32 weights) reads back as ``"bf16-mixed"`` on every device:
``trainer.precision``, the plugin's ``precision``, ``LightningModule.precision`` and Lite's plugin, on the CPU, a GPU,
XLA and TorchTPU. Before, XLA's plugin read ``"bf16-mixed"`` and the autocast plugin of the others ``"bf16"`` for the
same flag, so code that checks the value worked on one device only. ``precision="bf16"`` reads ``"bf16"`` as in 1.8.6.
The XLA tests pass without the patch (XLA read ``"bf16-mixed"`` already): they are the reference the others now match.
"""
import torch

import lightning_lite
import pytorch_lightning
from helpers.runif import RunIf
from pytorch_lightning.demos.boring_classes import BoringModel

FIXED_BY = "0099-feature-bf16-mixed-reads-the-same-on-every-device.patch"


class _Model(BoringModel):
    def training_step(self, batch, batch_idx):
        out = self.layer(batch)
        self.linear_dtype = out.dtype
        return out.float().sum()


def _trainer_reads(accelerator):
    trainer = pytorch_lightning.Trainer(accelerator=accelerator, devices=1, precision="bf16-mixed", logger=False)
    return type(trainer.precision_plugin).__name__, trainer.precision, trainer.precision_plugin.precision


def test_the_trainer_reads_bf16_mixed_on_the_cpu():
    assert _trainer_reads("cpu") == ("NativeMixedPrecisionPlugin", "bf16-mixed", "bf16-mixed")


@RunIf(xla=True)
def test_the_trainer_reads_bf16_mixed_on_xla():
    assert _trainer_reads("tpu") == ("TPUBf16MixedPrecisionPlugin", "bf16-mixed", "bf16-mixed")


def test_a_cpu_fit_under_bf16_mixed_autocasts_and_the_module_reads_the_same(tmp_path):
    model = _Model()
    trainer = pytorch_lightning.Trainer(accelerator="cpu", precision="bf16-mixed", max_steps=1, logger=False,
                                        enable_checkpointing=False, enable_progress_bar=False,
                                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model)
    assert model.precision == "bf16-mixed"
    assert model.linear_dtype == torch.bfloat16 and model.layer.weight.dtype == torch.float32


def test_bf16_reads_bf16_as_in_1_8_6():
    plugin = pytorch_lightning.Trainer(accelerator="cpu", precision="bf16", logger=False).precision_plugin
    assert plugin.precision == "bf16"
    assert lightning_lite.connector._Connector(accelerator="cpu", precision="bf16").precision.precision == "bf16"


def test_a_gpu_reads_bf16_mixed_too(monkeypatch):
    # no GPU here: the device count is mocked, as upstream's own tests do; the plugin is built, nothing runs
    monkeypatch.setattr(lightning_lite.accelerators.cuda, "num_cuda_devices", lambda: 1)
    monkeypatch.setattr(pytorch_lightning.accelerators.cuda, "num_cuda_devices", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = pytorch_lightning.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", logger=False)
    plugin = trainer.precision_plugin
    assert (type(plugin).__name__, plugin.device, plugin.precision) == ("NativeMixedPrecisionPlugin", "cuda", "bf16-mixed")
    lite = lightning_lite.connector._Connector(accelerator="gpu", devices=1, precision="bf16-mixed").precision
    assert (lite.device, lite.precision) == ("cuda", "bf16-mixed")


def _lite_reads(accelerator):
    class Lite(lightning_lite.LightningLite):
        def run(self):
            model = self.setup(torch.nn.Linear(4, 4))
            # Lite's module gives its outputs back in float32: the product is read under Lite's autocast
            with self.autocast():
                out = model.module(torch.ones(2, 4, device=self.device))
            return out.dtype, model.module.weight.dtype

    lite = Lite(accelerator=accelerator, devices=1, precision="bf16-mixed")
    return lite._precision.precision, lite.run()


def test_lite_reads_bf16_mixed_on_the_cpu_and_autocasts_to_bfloat16():
    assert _lite_reads("cpu") == ("bf16-mixed", (torch.bfloat16, torch.float32))


@RunIf(xla=True)
def test_lite_reads_bf16_mixed_on_xla_and_autocasts_to_bfloat16():
    assert _lite_reads("tpu") == ("bf16-mixed", (torch.bfloat16, torch.float32))


def test_the_trainer_s_autocast_plugin_keeps_its_name_in_lightning_lite():
    from pytorch_lightning.lite import LightningLite
    from pytorch_lightning.plugins import NativeMixedPrecisionPlugin

    class Lite(LightningLite):
        def run(self):
            pass

    plugin = Lite(accelerator="cpu", plugins=NativeMixedPrecisionPlugin("bf16-mixed", "cpu"))._precision
    assert (type(plugin).__name__, plugin.precision) == ("NativeMixedPrecision", "bf16-mixed")
    assert plugin.convert_input(torch.ones(2)).dtype == torch.bfloat16


@RunIf(torch_tpu=True)
def test_torch_tpu_reads_bf16_mixed(tmp_path):
    from helpers.torch_tpu_runs import run

    result = run(tmp_path, """
import pytorch_lightning as pl
from lightning_lite import LightningLite


class Lite(LightningLite):
    def run(self):
        return self._precision.device, self._precision.precision


# main
trainer = pl.Trainer(accelerator="tpu", devices=1, precision="bf16-mixed", logger=False)
emit({"trainer": [trainer.precision_plugin.device, trainer.precision],
      "lite": list(Lite(accelerator="tpu", devices=1, precision="bf16-mixed").run())})
""")
    assert result == {"trainer": ["tpu", "bf16-mixed"], "lite": ["tpu", "bf16-mixed"]}
