"""The gradient all-reduce runs inside the closure, after ``backward`` and before the update (fix
`tpu-reduce-gradients-inside-the-closure`).

The tests record the real sequence of events during ``Trainer.fit`` on the XLA device, with spies that call
through to the real functions.
"""
import re
from typing import List

import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla, model_class, recorder  # noqa: F401 (fixture)

FIXED_BY = "0005-tpu-reduce-gradients-inside-the-closure.patch"


@RunIf(xla=True)
def test_automatic_optimization_reduces_after_backward(tmp_path, recorder):
    fit_on_xla(model_class(recorder)(), tmp_path, max_steps=2)
    one_step = [("training_step", "opt0"), ("zero_grad", "opt0"), ("backward", ""), ("reduce", "opt0"),
                ("step", "opt0")]
    assert recorder.without("mark_step") == one_step * 2


@pytest.mark.guard  # manual optimization was already right: the user's backward runs before `opt.step()`
@RunIf(xla=True)
def test_manual_optimization_reduces_after_the_users_backward(tmp_path, recorder):
    fit_on_xla(model_class(recorder, automatic=False)(), tmp_path, max_steps=2)
    one_step = [("training_step", "opt0"), ("zero_grad", "opt0"), ("backward", ""), ("reduce", "opt0"),
                ("step", "opt0")]
    assert recorder.without("mark_step") == one_step * 2


@RunIf(xla=True)
def test_gradient_accumulation_reduces_once_per_update(tmp_path, recorder):
    fit_on_xla(model_class(recorder)(), tmp_path, max_steps=2, accumulate_grad_batches=2)
    skipped = [("training_step", "opt0"), ("zero_grad", "opt0"), ("backward", "")]
    applied = [("training_step", "opt0"), ("backward", ""), ("reduce", "opt0"), ("step", "opt0")]
    assert recorder.without("mark_step") == (skipped + applied) * 2


@RunIf(xla=True)
def test_two_optimizers_each_reduce_their_own_gradients(tmp_path, recorder):
    fit_on_xla(model_class(recorder, n_optimizers=2)(), tmp_path, max_steps=1)
    expected = []
    for tag in ("opt0", "opt1"):
        expected += [("training_step", tag), ("zero_grad", tag), ("backward", ""), ("reduce", tag), ("step", tag)]
    assert recorder.without("mark_step") == expected


@RunIf(xla=True)
def test_lbfgs_reduces_after_every_closure_evaluation(tmp_path, recorder):
    # 4 evaluations of the closure: on XLA each LBFGS iteration compiles graphs of its own (its history grows), and
    # the default 20 take most of a minute
    fit_on_xla(model_class(recorder, optimizer=torch.optim.LBFGS, max_iter=4)(), tmp_path, max_steps=1)
    events = recorder.without("mark_step")
    assert events[-1] == ("step", "opt0")
    evaluations = [i for i, e in enumerate(events) if e[0] == "backward"]
    assert len(evaluations) > 1, "LBFGS should have evaluated the closure several times"
    for i in evaluations:
        assert events[i + 1] == ("reduce", "opt0"), events
    assert sum(e[0] == "reduce" for e in events) == len(evaluations)


@pytest.mark.guard  # the message existed before the fix and must survive it
@RunIf(xla=True)
def test_none_loss_keeps_the_clear_error(tmp_path, recorder):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    # with several replicas (the recorder simulates them) a skipped backward is refused: "not implemented for TPUs"
    # before the skip fix, "not supported with several XLA processes" since
    with pytest.raises(MisconfigurationException,
                       match="Skipping backward by returning `None` from your `training_step`"):
        fit_on_xla(model_class(recorder, return_none=True)(), tmp_path, max_steps=1)


@RunIf(xla=True)
def test_the_step_graph_holds_the_all_reduce_over_the_backward_outputs(tmp_path, monkeypatch):
    """With a world size of 2 simulated, ``xm.reduce_gradients`` puts a ``cross_replica_sum`` into the pending IR.

    The IR of the gradients, taken right before the update, must end in that all-reduce and it must consume values
    computed by the backward in this graph. Without the fix the reduce ran before the closure and the gradients
    the update uses carry no all-reduce at all.
    """
    import torch_xla
    import torch_xla.runtime as xr

    monkeypatch.setattr(xr, "world_size", lambda: 2)
    dumps: List[str] = []
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Capturing(torch.optim.SGD):
        def step(self, closure=None):
            with torch.enable_grad():
                loss = closure()
            grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
            dumps.append(torch_xla._XLAC._get_xla_tensors_text(grads))
            super().step()
            return loss

    class Model(BoringModel):
        def configure_optimizers(self):
            return Capturing(self.layer.parameters(), lr=0.1)

        def on_train_start(self):
            # stale gradients, as a previous step leaves them: without the fix the all-reduce runs on these
            for p in self.parameters():
                p.grad = torch.zeros_like(p)

        def training_epoch_end(self, outputs):
            pass

    fit_on_xla(Model(), tmp_path, max_steps=2)
    assert len(dumps) == 2
    for ir in dumps:
        nodes = {}
        for line in ir.splitlines():
            m = re.match(r"\s*%(\d+) = .*? ([\w:]+)\(([^)]*)\)", line)
            if m:
                nodes[m.group(1)] = (m.group(2), [o.strip().lstrip("%") for o in m.group(3).split(",") if o.strip()],
                                     line)
        roots = [n for n in nodes.values() if "ROOT" in n[2]]
        assert roots, ir
        for op, operands, line in roots:
            # the gradients the update uses are the outputs of an all-reduce ...
            assert op == "xla::cross_replica_sum", f"the gradients the update uses were not all-reduced:\n{ir}"
            # ... over the backward's outputs, computed in this graph (not data from an earlier graph)
            computed = [o for o in operands if o in nodes and nodes[o][0] != "xla::device_data"]
            assert computed, f"the all-reduce does not consume the backward's outputs:\n{ir}"
            assert any(nodes[o.split('.')[0]][0] in ("aten::mm", "aten::permute", "aten::sum", "aten::view") for o in computed)
