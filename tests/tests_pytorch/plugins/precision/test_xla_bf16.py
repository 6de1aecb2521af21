"""``precision="bf16"`` on XLA computes in bfloat16, in any process and for every Trainer (fix
`xla-bf16-converts-the-module`).

The old plugin set ``XLA_USE_BF16``, which torch_xla reads once, at the first XLA tensor of the process: once the
runtime was up (a second Trainer, a notebook, this test session) training silently ran in float32.

The plugin converts the module instead; what the user gets back stays in the user's dtypes, as with that variable:
the module after each run (also a failed or interrupted one), the checkpoints' state dict, and the predictions.
"""
import os

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0013-xla-bf16-converts-the-module.patch"


def _module(record):
    from pytorch_lightning import LightningModule

    class Regression(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            import torch_xla

            record.setdefault("hlo", torch_xla._XLAC._get_xla_tensors_hlo([loss]))
            record.setdefault("input_dtype", x.dtype)
            record.setdefault("new_tensor_dtype", torch.ones(1).dtype)
            record.setdefault("param_dtypes_in_step", {p.dtype for p in self.parameters()})
            record.setdefault("losses", []).append(loss.detach())
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            record.setdefault("val_input_dtype", x.dtype)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(1)
            x = torch.randn(256, 8, generator=g)
            y = x.sum(dim=1, keepdim=True) * 0.3
            return torch.utils.data.DataLoader(list(zip(x, y)), batch_size=16)

        val_dataloader = train_dataloader

    return Regression()


@RunIf(xla=True)
def test_trainer_bf16_computes_in_bfloat16_and_learns(tmp_path):
    record = {}
    module = _module(record)
    trainer = fit_on_xla(module, tmp_path, precision="bf16", max_epochs=3, limit_val_batches=2)
    # the step graph computes in bf16 (the runtime of this process started long before this Trainer)
    assert "bf16" in record["hlo"], record["hlo"][:2000]
    assert record["input_dtype"] == torch.bfloat16 and record["val_input_dtype"] == torch.bfloat16
    assert record["new_tensor_dtype"] == torch.bfloat16
    assert record["param_dtypes_in_step"] == {torch.bfloat16}
    # and the user gets the module back as it was given
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert "XLA_USE_BF16" not in os.environ
    # the default dtype is back to float32 outside the steps
    assert torch.get_default_dtype() == torch.float32
    losses = [float(v) for v in record["losses"]]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses
    assert trainer.state.finished


def _bn_module(record, dtype=torch.float32, fail_at=None):
    """A regression model with a BatchNorm (float running statistics, an int64 ``num_batches_tracked``) in
    ``dtype``; its steps record the dtypes they see, and its training step raises ``fail_at = (step, exception)``."""
    from pytorch_lightning import LightningModule

    class BatchNormRegression(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
            )
            self.to(dtype)

        def forward(self, x):
            return self.net(x)

        def _seen(self, stage):
            record.setdefault(stage, set()).update(t.dtype for t in self.net.state_dict(keep_vars=True).values())

        def training_step(self, batch, batch_idx):
            if fail_at is not None and self.global_step == fail_at[0]:
                raise fail_at[1]
            self._seen("fit")
            optimizer_params = self.optimizers().optimizer.param_groups[0]["params"]
            record["optimizer_holds_the_parameters"] = all(a is b for a, b in zip(optimizer_params, self.parameters()))
            record["parameters"] = list(self.parameters())
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            import torch_xla

            record.setdefault("hlo", torch_xla._XLAC._get_xla_tensors_hlo([loss]))
            record.setdefault("losses", []).append(loss.detach())
            return loss

        def validation_step(self, batch, batch_idx):
            self._seen("validate")

        def test_step(self, batch, batch_idx):
            self._seen("test")

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            self._seen("predict")
            y = self(batch[0])
            return {"y": y, "label": (y > 0).long(), "double": y.double()}

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

        def train_dataloader(self):
            g = torch.Generator().manual_seed(1)
            x = torch.randn(128, 8, generator=g)
            y = x.sum(dim=1, keepdim=True) * 0.3
            return torch.utils.data.DataLoader(list(zip(x, y)), batch_size=16)

        val_dataloader = test_dataloader = predict_dataloader = train_dataloader

    return BatchNormRegression()


def _dtypes(module):
    return {name: t.dtype for name, t in module.state_dict(keep_vars=True).items()}


FP32 = {
    "net.0.weight": torch.float32, "net.0.bias": torch.float32, "net.1.weight": torch.float32,
    "net.1.bias": torch.float32, "net.1.running_mean": torch.float32, "net.1.running_var": torch.float32,
    "net.1.num_batches_tracked": torch.int64, "net.3.weight": torch.float32, "net.3.bias": torch.float32,
}
FP64 = {name: torch.int64 if dtype == torch.int64 else torch.float64 for name, dtype in FP32.items()}


def _trainer(tmp_path, **kwargs):
    from pytorch_lightning import Trainer

    defaults = dict(accelerator="tpu", devices=1, precision="bf16", default_root_dir=tmp_path, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, max_epochs=1,
                    limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2, num_sanity_val_steps=0)
    defaults.update(kwargs)
    return Trainer(**defaults)


@RunIf(xla=True)
def test_trainer_bf16_gives_the_module_back_after_every_stage(tmp_path):
    """After ``fit``, ``validate``, ``test`` and ``predict``, every parameter and buffer has its dtype again and the
    model runs on float32 CPU input; inside each stage it was bf16, and the optimizer held the converted parameters."""
    record = {}
    module = _bn_module(record)
    trainer = _trainer(tmp_path)
    trainer.fit(module)
    assert record["fit"] == {torch.bfloat16, torch.int64}
    assert "bf16" in record["hlo"]
    assert record["optimizer_holds_the_parameters"] is True
    assert _dtypes(module) == FP32 and module.dtype == torch.float32
    # the user's own code after fit: float32 input on the CPU ("mat1 and mat2 must have the same dtype" before)
    module.eval()
    assert module(torch.randn(4, 8)).dtype == torch.float32
    for stage in ("validate", "test", "predict"):
        getattr(trainer, stage)(module)
        assert record[stage] == {torch.bfloat16, torch.int64}, stage
        assert _dtypes(module) == FP32, stage
        assert module.dtype == torch.float32, stage
    assert torch.get_default_dtype() == torch.float32


@RunIf(xla=True)
def test_trainer_bf16_predictions_come_back_in_the_module_dtype(tmp_path):
    """``predict`` returns the bf16 tensors of ``predict_step`` in the module's dtype, as ``XLA_USE_BF16`` reported
    them; tensors of another dtype (int64 labels, a float64 the step made) come back as they are."""
    record = {}
    module = _bn_module(record)
    predictions = _trainer(tmp_path).predict(module)
    assert record["predict"] == {torch.bfloat16, torch.int64}
    assert len(predictions) == 2
    for batch in predictions:
        assert batch["y"].dtype == torch.float32 and batch["y"].device.type == "cpu"
        assert batch["label"].dtype == torch.int64
        assert batch["double"].dtype == torch.float64


@RunIf(xla=True)
def test_trainer_bf16_gives_a_float64_module_its_dtypes_back(tmp_path):
    """A float64 module trains in bf16 and comes back in float64 (its int64 buffer untouched), also in the
    checkpoint; its bf16 predictions come back in float64, the module's dtype."""
    record = {}
    module = _bn_module(record, dtype=torch.float64)
    assert _dtypes(module) == FP64 and module.dtype == torch.float64
    trainer = _trainer(tmp_path)
    trainer.fit(module)
    assert record["fit"] == {torch.bfloat16, torch.int64}
    assert _dtypes(module) == FP64 and module.dtype == torch.float64
    trainer.save_checkpoint(tmp_path / "after.ckpt")
    saved = torch.load(tmp_path / "after.ckpt", weights_only=False)["state_dict"]
    assert {name: t.dtype for name, t in saved.items()} == FP64
    predictions = trainer.predict(module)
    assert {batch["y"].dtype for batch in predictions} == {torch.float64}
    assert _dtypes(module) == FP64


@RunIf(xla=True)
@pytest.mark.parametrize("interruption", ["error", "ctrl-c"])
def test_trainer_bf16_gives_the_module_back_when_the_run_stops(tmp_path, interruption):
    """A run that fails (teardown) or is interrupted with Ctrl-C (no teardown: the model stays on its device)
    gives the module its dtypes back too; on the device, the parameters stay the same objects (in place)."""
    record = {}
    exception = RuntimeError("boom") if interruption == "error" else KeyboardInterrupt()
    module = _bn_module(record, fail_at=(3, exception))
    trainer = _trainer(tmp_path)
    if interruption == "error":
        with pytest.raises(RuntimeError, match="boom"):
            trainer.fit(module)
    else:
        trainer.fit(module)
    assert trainer.interrupted
    assert record["fit"] == {torch.bfloat16, torch.int64}
    assert _dtypes(module) == FP32 and module.dtype == torch.float32
    x = torch.randn(4, 8)
    module.eval()
    if interruption == "ctrl-c":
        assert module.device.type == "xla"
        assert all(a is b for a, b in zip(module.parameters(), record["parameters"]))
        # the gradients of the last step (Ctrl-C came in the next training step, before its backward)
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        assert len(grads) == 6 and {g.dtype for g in grads} == {torch.float32}
        x = x.to(module.device)
    assert module(x).dtype == torch.float32


@RunIf(xla=True)
def test_trainer_bf16_checkpoints_hold_the_original_dtypes(tmp_path):
    """The state dict of the checkpoints written during a bf16 fit (``ModelCheckpoint``, weights only or not, and
    ``trainer.save_checkpoint``) is in float32: copies of the bf16 values, while the live module stays bf16. The
    optimizer state is saved as the optimizer holds it, in bf16."""
    from pytorch_lightning import Callback
    from pytorch_lightning.callbacks import ModelCheckpoint

    record = {}

    class SaveMidway(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 5:
                trainer.save_checkpoint(tmp_path / "midway.ckpt")
                live = pl_module.state_dict(keep_vars=True)
                record["live_after_save"] = {n: t.detach().cpu() for n, t in live.items()}

    module = _bn_module(record)
    full = ModelCheckpoint(dirpath=tmp_path, filename="full", save_top_k=-1)
    weights = ModelCheckpoint(dirpath=tmp_path, filename="weights", save_top_k=-1, save_weights_only=True)
    _trainer(tmp_path, enable_checkpointing=True, callbacks=[SaveMidway(), full, weights]).fit(module)

    live = record["live_after_save"]
    # the save converted copies: the module computed on in bf16
    assert {n: t.dtype for n, t in live.items()} == {n: torch.int64 if d == torch.int64 else torch.bfloat16
                                                     for n, d in FP32.items()}
    assert len(record["losses"]) == 8 and "bf16" in record["hlo"]
    midway = torch.load(tmp_path / "midway.ckpt", weights_only=False)
    assert {n: t.dtype for n, t in midway["state_dict"].items()} == FP32
    for name, value in midway["state_dict"].items():
        assert torch.equal(value, live[name].to(value.dtype)), name
    momentum = [s["momentum_buffer"] for s in midway["optimizer_states"][0]["state"].values()]
    assert len(momentum) == 6 and {t.dtype for t in momentum} == {torch.bfloat16}
    for name in ("full.ckpt", "weights.ckpt"):
        saved = torch.load(tmp_path / name, weights_only=False)
        assert {n: t.dtype for n, t in saved["state_dict"].items()} == FP32, name
    assert "optimizer_states" not in torch.load(tmp_path / "weights.ckpt", weights_only=False)


@RunIf(xla=True)
def test_trainer_bf16_resumes_from_its_checkpoint(tmp_path):
    """A bf16 run resumed from the float32 checkpoint of its first epoch trains its second epoch in bf16 with the
    losses of the run that was not interrupted (the weights and the SGD momentum came back)."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    whole = {}
    ckpt = ModelCheckpoint(dirpath=tmp_path, filename="{epoch}", save_top_k=-1)
    _trainer(tmp_path, max_epochs=2, enable_checkpointing=True, callbacks=[ckpt]).fit(_bn_module(whole))
    first_epoch = tmp_path / "epoch=0.ckpt"
    saved = torch.load(first_epoch, weights_only=False)
    assert {n: t.dtype for n, t in saved["state_dict"].items()} == FP32

    resumed = {}
    module = _bn_module(resumed)
    _trainer(tmp_path / "resumed", max_epochs=2).fit(module, ckpt_path=str(first_epoch))
    assert resumed["fit"] == {torch.bfloat16, torch.int64} and "bf16" in resumed["hlo"]
    assert _dtypes(module) == FP32
    expected = [float(v) for v in whole["losses"][8:]]
    got = [float(v) for v in resumed["losses"]]
    assert len(got) == len(expected) == 8
    assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-3, (got, expected)
