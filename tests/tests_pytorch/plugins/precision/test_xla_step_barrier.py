"""A barrier (``xm.mark_step``) ends every optimizer step on XLA (fix `xla-mark-step-after-optimizer-step`), for the
Trainer."""
import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla, model_class, recorder  # noqa: F401 (fixture)

FIXED_BY = "0006-xla-mark-step-after-optimizer-step.patch"


@RunIf(xla=True)
@pytest.mark.parametrize("automatic", [True, False], ids=["automatic", "manual"])
def test_mark_step_right_after_every_optimizer_step(tmp_path, recorder, automatic):
    fit_on_xla(model_class(recorder, automatic=automatic)(), tmp_path, max_steps=3)
    one_step = [("training_step", "opt0"), ("zero_grad", "opt0"), ("backward", ""), ("reduce", "opt0"),
                ("step", "opt0"), ("mark_step", "")]
    assert recorder.events == one_step * 3


@RunIf(xla=True)
def test_mark_step_after_the_steps_of_two_optimizers(tmp_path, recorder):
    """A barrier follows the last optimizer's step of the batch. Whether one follows the first one as well is not
    this fix's business: the Trainer now ends the batch's graph once, after both (`test_xla_two_optimizers_one_graph`).
    """
    fit_on_xla(model_class(recorder, n_optimizers=2)(), tmp_path, max_steps=1)
    steps = [i for i, e in enumerate(recorder.events) if e[0] == "step"]
    assert len(steps) == 2
    assert recorder.events[steps[-1] + 1] == ("mark_step", "")
    assert 1 <= sum(e[0] == "mark_step" for e in recorder.events) <= 2


@pytest.mark.guard  # true before the fix too; the barrier must not swallow the return value
@RunIf(xla=True)
def test_optimizer_step_output_is_still_returned(tmp_path):
    """``LightningOptimizer.step`` returns what the optimizer's ``step`` returned (the closure's loss for SGD)."""
    from pytorch_lightning.demos.boring_classes import BoringModel

    returned = []

    class Model(BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            loss = self.layer(batch).sum()
            opt.zero_grad()
            self.manual_backward(loss)
            returned.append(opt.step(closure=lambda: torch.tensor(7.0)))

        def training_epoch_end(self, outputs):
            pass

    fit_on_xla(Model(), tmp_path, max_steps=2)
    assert [float(r) for r in returned] == [7.0, 7.0]


@RunIf(xla=True)
def test_one_graph_execution_per_step(tmp_path, xla_metrics):
    """With the barrier, a step that reads nothing runs exactly one graph: forward, backward, reduce and update.

    Without it nothing cuts the graph and the steps pile up unexecuted (0 executions per step, a growing graph).
    """
    from pytorch_lightning import Callback
    from pytorch_lightning.demos.boring_classes import BoringModel

    counts = []

    class Count(Callback):
        def on_train_batch_end(self, *args):
            counts.append(xla_metrics.executions())

    class ManualModel(BoringModel):
        """Manual optimization: the Trainer's running loss does not read the loss, so only the barrier counts."""

        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(self.layer(batch).sum())
            opt.step()

        def training_epoch_end(self, outputs):
            pass

    fit_on_xla(ManualModel(), tmp_path, max_steps=12, callbacks=[Count()])
    per_step = [b - a for a, b in zip(counts[4:], counts[5:])]
    assert per_step == [1] * len(per_step), counts
