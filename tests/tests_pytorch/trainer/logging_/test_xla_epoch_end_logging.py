"""A value logged on XLA outside of a batch (``validation_epoch_end``, ``training_epoch_end``, the epoch hooks) is in
the results at once, as without XLA.

The host copy of a value logged in a step is deferred until the step's barrier has run the step's graph. Outside of
a batch no barrier is coming: such a value is copied when it is logged, and a read of ``trainer._results`` right
after ``self.log`` sees it. Before, the copy waited for the next read of the metrics, and the result read 0.0.
"""
import pytest

from helpers.runif import RunIf

FIXED_BY = "0010-defer-host-transfer-of-logged-xla-values.patch"


@pytest.mark.guard  # true before the copies were deferred: every value was copied when it was logged
@RunIf(xla=True)
def test_values_logged_at_an_epoch_s_end_are_in_the_results_at_once(tmp_path):
    from pytorch_lightning import Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    seen = {}

    class Model(BoringModel):
        def training_epoch_end(self, outputs):
            self.log("train_end", 3.0, reduce_fx="mean")
            seen["train_end"] = float(self.trainer._results["training_epoch_end.train_end"].value)

        def validation_epoch_end(self, outputs):
            self.log("val_end", 4.0, reduce_fx="mean")
            seen.setdefault("val_end", []).append(float(self.trainer._results["validation_epoch_end.val_end"].value))

        def on_validation_epoch_end(self):
            mean = self.layer.weight.mean()
            self.log("weight_mean", mean)
            seen["weight_mean"] = (float(self.trainer._results["on_validation_epoch_end.weight_mean"].value),
                                   float(mean))

    trainer = Trainer(accelerator="tpu", devices=1, default_root_dir=tmp_path, logger=False, max_epochs=1,
                      limit_train_batches=3, limit_val_batches=3, num_sanity_val_steps=2, enable_checkpointing=False,
                      enable_model_summary=False, enable_progress_bar=False)
    trainer.fit(Model())
    assert seen["train_end"] == 3.0
    # the sanity check's and the epoch's validation
    assert seen["val_end"] == [4.0, 4.0]
    assert seen["weight_mean"][0] == seen["weight_mean"][1]
    assert trainer.callback_metrics["val_end"] == 4.0
