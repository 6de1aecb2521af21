"""Logged results stay on the CPU when the module is on XLA (fix `result-collection-stays-on-cpu-for-xla`)."""
import torch

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0008-result-collection-stays-on-cpu-for-xla.patch"


def _logging_model(seen):
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("a", out["loss"], prog_bar=True)
            self.log("b", out["loss"] * 2, on_step=True, on_epoch=True)
            self.log("c", out["loss"] + 1, reduce_fx="max")
            results = self.trainer._results
            seen.append(dict(
                results_device=torch.device(results.device).type,
                values={k: v.value.device.type for k, v in results.items()},
                param=self.layer.weight.device.type,
            ))
            return out

        def validation_step(self, batch, batch_idx):
            loss = self.layer(batch).sum()
            self.log("val_loss", loss)
            seen.append(dict(results_device=torch.device(self.trainer._results.device).type, validation=True))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

        def training_epoch_end(self, outputs):
            pass

        def validation_epoch_end(self, outputs):
            pass

    return Model()


@RunIf(xla=True)
def test_logged_values_and_metrics_stay_on_cpu(tmp_path):
    from pytorch_lightning import Callback

    seen = []
    state = {}

    class Probe(Callback):
        def on_train_batch_end(self, trainer, pl_module, *args):
            state["callback_metrics"] = {k: v.device.type for k, v in trainer.callback_metrics.items()}
            state["progress_bar"] = {k: v.device.type if isinstance(v, torch.Tensor) else type(v).__name__
                                     for k, v in trainer.progress_bar_metrics.items()}
            opt_state = trainer.optimizers[0].state
            state["optimizer_state"] = {v.device.type for s in opt_state.values() for v in s.values()
                                        if isinstance(v, torch.Tensor)}

    trainer = fit_on_xla(_logging_model(seen), tmp_path, max_steps=3, limit_val_batches=2, val_check_interval=3,
                         callbacks=[Probe()])
    train = [s for s in seen if not s.get("validation")]
    assert {s["results_device"] for s in train} == {"cpu"}
    assert {d for s in train for d in s["values"].values()} == {"cpu"}
    # the model and the optimizer state are still on the XLA device
    assert {s["param"] for s in train} == {"xla"}
    assert state["optimizer_state"] == {"xla"}
    assert set(state["callback_metrics"].values()) == {"cpu"}
    # the progress bar gets host numbers (Python floats, or CPU tensors), never XLA tensors
    assert "a" in state["progress_bar"] and set(state["progress_bar"].values()) <= {"cpu", "float", "int"}
    assert {s["results_device"] for s in seen if s.get("validation")} == {"cpu"}
    assert trainer.callback_metrics["val_loss"].device.type == "cpu"
    # the values are the right ones: "b" is twice "a" in the last step
    assert torch.allclose(trainer.callback_metrics["b_step"], 2 * trainer.callback_metrics["a"])


@RunIf(xla=True)
def test_logged_values_are_not_sent_back_to_the_device(tmp_path, xla_metrics):
    """The only host-to-device transfers are the batches; before, each of the three logged values went back, every
    step. (A batch may be copied ahead of its step, on the device loader's thread: the count is over the steps.)"""
    from pytorch_lightning import Callback

    seen = []
    uploads = []

    class Count(Callback):
        def on_train_batch_end(self, *args):
            uploads.append(xla_metrics.get("TransferToDeviceTime"))

    fit_on_xla(_logging_model(seen), tmp_path, max_steps=8, callbacks=[Count()])
    steps = len(uploads) - 4
    assert 0 <= uploads[-1] - uploads[3] <= steps, uploads
