"""A barrier (``xm.mark_step``) ends every ``optimizer.step`` of a Lite loop on XLA (fix
`xla-mark-step-after-optimizer-step`)."""
import torch

from helpers.runif import RunIf
from helpers.xla_recording import recorder, recording_optimizer  # noqa: F401 (fixture)

FIXED_BY = "0006-xla-mark-step-after-optimizer-step.patch"


def _run_lite(recorder, steps: int, xla_metrics=None):
    from lightning_lite import LightningLite

    counts = []

    class Lite(LightningLite):
        def run(self):
            model = torch.nn.Linear(8, 2)
            optimizer = recording_optimizer(torch.optim.SGD, recorder, "opt0", params=model.parameters(), lr=0.1)
            model, optimizer = self.setup(model, optimizer)
            outputs = []
            for _ in range(steps):
                batch = torch.randn(4, 8, device=self.device)
                optimizer.zero_grad()
                loss = model(batch).sum()
                recorder.add("backward")
                self.backward(loss)
                outputs.append(optimizer.step())
                recorder.add("after_step")
                if xla_metrics is not None:
                    counts.append(xla_metrics.executions())
            return outputs

    return Lite(accelerator="tpu", devices=1).run(), counts


@RunIf(xla=True)
def test_lite_step_ends_with_exactly_one_mark_step(recorder):
    _run_lite(recorder, steps=3)
    # xm.optimizer_step reduces before the update: right in Lite, where the user ran backward already
    one_step = [("zero_grad", "opt0"), ("backward", ""), ("reduce", "opt0"), ("step", "opt0"), ("mark_step", ""),
                ("after_step", "")]
    assert recorder.events == one_step * 3


@RunIf(xla=True)
def test_lite_one_graph_execution_per_step(recorder, xla_metrics):
    outputs, counts = _run_lite(recorder, steps=10, xla_metrics=xla_metrics)
    # whatever `optimizer.step` returns is still returned (SGD without a closure returns None)
    assert outputs == [None] * 10
    per_step = [b - a for a, b in zip(counts[3:], counts[4:])]
    assert per_step == [1] * len(per_step), counts
