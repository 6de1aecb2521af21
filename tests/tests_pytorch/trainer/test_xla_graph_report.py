"""The XLA graph report (feature `feature-xla-graph-report`): after the warm-up, a training step that compiles, runs
more than one graph or makes more than one device-to-host transfer is reported once per cause, with the user's line
or the changed shapes.

Everything runs on a real XLA device (``PJRT_DEVICE=CPU`` here). The offending lines are found with ``inspect``.
"""
import inspect
import warnings
from pathlib import Path

import pytest
import torch

from helpers.runif import RunIf

FIXED_BY = "0054-feature-xla-graph-report.patch"

BATCHES = 8


def _line_of(function, marker: str) -> int:
    """The line number of the line of ``function`` that contains ``marker``."""
    lines, first = inspect.getsourcelines(function)
    found = [first + i for i, text in enumerate(lines) if marker in text]
    assert len(found) == 1, (marker, found)
    return found[0]


def _loader(shapes=None, as_dict=False):
    g = torch.Generator().manual_seed(0)
    batches = []
    for i in range(BATCHES):
        length = 16 if shapes is None else shapes[i]
        x = torch.randn(8, length, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        batches.append({"input_ids": x, "labels": y} if as_dict else (x, y))
    return torch.utils.data.DataLoader(batches, batch_size=None)


def _module_class():
    from pytorch_lightning import LightningModule

    class Base(LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))

        def loss(self, batch):
            x, y = (batch["input_ids"], batch["labels"]) if isinstance(batch, dict) else batch
            # any sequence length works: the first 16 features after padding with zeros
            x = torch.nn.functional.pad(x, (0, max(0, 16 - x.shape[1])))[:, :16] if x.shape[1] != 16 else x
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    return Base


def _fit(tmp_path, module, loader=None, logger=False, strategy=None, steps=BATCHES, **trainer_kwargs):
    """Fit ``steps`` batches on one XLA device; the report's warnings, in order."""
    from pytorch_lightning import Trainer
    from pytorch_lightning.utilities.xla_graph_report import XLAGraphReportWarning

    trainer = Trainer(
        accelerator="tpu", devices=1, strategy=strategy, max_steps=steps, default_root_dir=tmp_path, logger=logger,
        enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0, **trainer_kwargs,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, loader if loader is not None else _loader())
    return [str(w.message) for w in caught if issubclass(w.category, XLAGraphReportWarning)]


def _one_report(reports):
    assert len(reports) == 1, reports
    return reports[0]


@RunIf(xla=True)
def test_data_dependent_branch_is_reported_with_its_line(tmp_path):
    Base = _module_class()

    class Branch(Base):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            if loss > 0.0:  # the branch
                loss = loss * 1.0
            self.log("loss", loss, prog_bar=True)
            return loss

    report = _one_report(_fit(tmp_path, Branch()))
    line = _line_of(Branch.training_step, "# the branch")
    assert f"{__file__}:{line} in training_step" in report
    assert "Tensor.__bool__" in report
    assert "ran 2 graph(s)" in report and "made 2 device-to-host transfer(s)" in report
    assert "PL_XLA_GRAPH_REPORT=off" in report


@RunIf(xla=True)
def test_item_in_training_step_is_reported_with_its_line(tmp_path):
    Base = _module_class()

    class Item(Base):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.value = loss.item()  # the read
            return loss

    report = _one_report(_fit(tmp_path, Item()))
    assert f"{__file__}:{_line_of(Item.training_step, '# the read')} in training_step" in report
    assert "Tensor.item" in report


@RunIf(xla=True)
def test_extra_graphs_of_lightning_itself_name_its_part(tmp_path):
    """``track_grad_norm=2``: Lightning's gradient norms are read on the host in the middle of the step. No user line
    caused it; the report names the place in Lightning and its caller there."""
    Base = _module_class()
    report = _one_report(_fit(tmp_path, Base(), track_grad_norm=2))
    assert "Lightning itself did" in report
    assert "Lightning, a callback or a library" not in report
    grads = str(Path("pytorch_lightning", "utilities", "grads.py"))
    assert f"{grads}:" in report and " in grad_norm: `" in report
    assert "in _track_grad_norm" in report  # its caller in Lightning
    # the step's own barrier and transfer are listed too, with what they cost
    assert "torch_xla.sync ran 1 graph(s)" in report and "device-to-host copy ran 0 graph(s)" in report


@RunIf(xla=True)
@pytest.mark.parametrize("as_dict", [False, True])
def test_changing_batch_shapes_are_reported_with_the_shapes(tmp_path, as_dict):
    """Dynamic padding: every new sequence length compiles the step again; the report names the input's shapes."""
    Base = _module_class()
    # lengths no other test of this process compiled (the compilation cache is per process)
    new = (19, 29) if as_dict else (17, 23)
    lengths = [16, 16, 16, 16, new[0], new[1], new[1], 16]
    reports = _fit(tmp_path, Base(), loader=_loader(lengths, as_dict=as_dict))
    report = _one_report(reports)  # once, however many new lengths
    name = "input_ids" if as_dict else "batch[0]"
    assert f"{name} (8, 16) -> (8, {new[0]})" in report
    assert "compiled 1 graph(s)" in report
    assert "labels" not in report and "batch[1]" not in report


@RunIf(xla=True)
def test_tensor_passed_to_the_logger_is_reported_with_its_line(tmp_path):
    """``self.logger.experiment.add_scalar(tag, tensor)``: TensorBoard's writer copies the tensor to the host in the
    middle of the step."""
    from pytorch_lightning.loggers import TensorBoardLogger

    Base = _module_class()

    class LogsToTensorBoard(Base):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.logger.experiment.add_scalar("loss", loss, batch_idx)  # the logger
            return loss

    report = _one_report(_fit(tmp_path, LogsToTensorBoard(), logger=TensorBoardLogger(tmp_path)))
    assert f"{__file__}:{_line_of(LogsToTensorBoard.training_step, '# the logger')} in training_step" in report
    assert "tensorboardX" in report  # where inside the library the copy happened


@RunIf(xla=True)
def test_tensor_passed_to_a_custom_logger_names_the_training_step_line(tmp_path):
    from pytorch_lightning.loggers.logger import Logger

    class Writer:
        def __init__(self):
            self.values = []

        def add_scalar(self, tag, value, step=None):
            self.values.append(float(value))  # the conversion

    class TinyLogger(Logger):
        name, version = "tiny", 0

        def __init__(self):
            super().__init__()
            self._writer = Writer()

        @property
        def experiment(self):
            return self._writer

        def log_metrics(self, metrics, step=None):
            pass

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    Base = _module_class()

    class LogsToIt(Base):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.logger.experiment.add_scalar("loss", loss)  # the logger call
            return loss

    report = _one_report(_fit(tmp_path, LogsToIt(), logger=TinyLogger()))
    assert f"{__file__}:{_line_of(Writer.add_scalar, '# the conversion')} in add_scalar" in report
    assert f"called from {__file__}:{_line_of(LogsToIt.training_step, '# the logger call')} in training_step" in report


@RunIf(xla=True)
def test_a_clean_step_reports_nothing_and_costs_nothing(tmp_path, xla_metrics):
    """The plain step with ``self.log(..., prog_bar=True)``: no report, and the same compilations, graphs and transfers
    with the report on as with it off (0 / 1 / 1 per step after the warm-up)."""
    from pytorch_lightning import Callback
    from pytorch_lightning.strategies import SingleTPUStrategy

    from helpers.xla_metrics import XLACounters

    class Count(Callback):
        def __init__(self):
            self.counts = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if batch_idx == 3:
                self.start = (XLACounters.get("CompileTime"), XLACounters.get("ExecuteTime"),
                              XLACounters.get("TransferFromDeviceTime"))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == BATCHES - 1:
                end = (XLACounters.get("CompileTime"), XLACounters.get("ExecuteTime"),
                       XLACounters.get("TransferFromDeviceTime"))
                self.counts = [(b - a) / (BATCHES - 3) for a, b in zip(self.start, end)]  # batches 3..7

    Base = _module_class()
    per_step = {}
    for mode in ("warn", "off"):
        module = Base()
        count = Count()
        module.configure_callbacks = lambda count=count: [count]
        assert _fit(tmp_path, module, strategy=SingleTPUStrategy(0, graph_report=mode)) == []
        per_step[mode] = count.counts
    assert per_step["warn"] == per_step["off"] == [0, 1, 1]


@RunIf(xla=True)
def test_off_reports_nothing(tmp_path, monkeypatch):
    Base = _module_class()

    class Item(Base):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.value = loss.item()
            return loss

    monkeypatch.setenv("PL_XLA_GRAPH_REPORT", "off")
    assert _fit(tmp_path, Item()) == []
    monkeypatch.delenv("PL_XLA_GRAPH_REPORT")
    from pytorch_lightning.strategies import SingleTPUStrategy

    assert _fit(tmp_path, Item(), strategy=SingleTPUStrategy(0, graph_report="off")) == []


@RunIf(xla=True)
def test_error_mode_raises_with_the_cause(tmp_path, monkeypatch):
    from pytorch_lightning.utilities.xla_graph_report import XLAGraphReportError

    Base = _module_class()

    class Item(Base):
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.value = loss.item()  # the read
            return loss

    monkeypatch.setenv("PL_XLA_GRAPH_REPORT", "error")
    with pytest.raises(XLAGraphReportError, match="PL_XLA_GRAPH_REPORT=off") as err:
        _fit(tmp_path, Item())
    assert f"{__file__}:{_line_of(Item.training_step, '# the read')} in training_step" in str(err.value)
    # the argument wins over the environment
    assert _fit(tmp_path, Item(), strategy=_single_tpu(graph_report="off")) == []


def _single_tpu(**kwargs):
    from pytorch_lightning.strategies import SingleTPUStrategy

    return SingleTPUStrategy(0, **kwargs)


@RunIf(xla=True)
def test_bad_values_are_refused_with_the_accepted_ones(monkeypatch):
    from pytorch_lightning import Trainer
    from pytorch_lightning.strategies import TPUSpawnStrategy, XLASPMDStrategy
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    accepted = "use one of 'warn', 'error', 'off'"
    for make in (lambda: _single_tpu(graph_report="loud"), lambda: TPUSpawnStrategy(graph_report="loud"),
                 lambda: XLASPMDStrategy(graph_report="loud")):
        with pytest.raises(MisconfigurationException, match=f"graph_report='loud' .*{accepted}"):
            make()
    monkeypatch.setenv("PL_XLA_GRAPH_REPORT", "loud")
    with pytest.raises(MisconfigurationException, match=f"PL_XLA_GRAPH_REPORT='loud' .*{accepted}"):
        Trainer(accelerator="tpu", devices=1)
    # upper case and spaces are accepted
    monkeypatch.setenv("PL_XLA_GRAPH_REPORT", " ERROR ")
    assert _single_tpu()._graph_report_mode == "error"
    assert TPUSpawnStrategy(graph_report="off")._graph_report_mode == "off"


@RunIf(xla=True)
@pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])
def test_spmd_strategies_report_too(strategy, fork_server):
    """On 4 XLA:CPU devices in one SPMD process: the clean step reports nothing, ``.item()`` is reported with its
    line."""
    from helpers.xla_subprocess import run_python

    code = f"""
        import sys, warnings, torch
        from pytorch_lightning import LightningModule, Trainer
        from pytorch_lightning.utilities.xla_graph_report import XLAGraphReportWarning

        class M(LightningModule):
            def __init__(self, item):
                super().__init__()
                self.net, self.item = torch.nn.Linear(16, 4), item

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = torch.nn.functional.cross_entropy(self.net(x), y)
                if self.item:
                    self.value, self.line = loss.item(), sys._getframe().f_lineno  # the read (and its number)
                self.log("loss", loss, prog_bar=True)
                return loss

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        data = [(torch.randn(16), i % 4) for i in range(96)]
        out = {{}}
        for item in (False, True):
            module = M(item)
            trainer = Trainer(accelerator="tpu", strategy={strategy!r}, max_steps=8, logger=False,
                              enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8, drop_last=True))
            out[str(item)] = [str(w.message) for w in caught if issubclass(w.category, XLAGraphReportWarning)]
        out["line"] = module.line
        emit(out)
    """
    out = run_python(code, env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "4"}, timeout=300, fork_server=fork_server)
    assert out["False"] == []
    report = _one_report(out["True"])
    # the code runs with `python -c`: its file is "<string>", without source to quote
    assert f"<string>:{out['line']} in training_step" in report
    assert "Tensor.item" in report and "ran 2 graph(s)" in report


_SPAWN_MODULE = '''
import os, warnings, torch
import pytorch_lightning as pl


class ItemModule(pl.LightningModule):
    def __init__(self, out_dir):
        super().__init__()
        self.net, self.out_dir = torch.nn.Linear(6, 3), out_dir

    def on_train_start(self):
        # what each process warns, in a file per rank
        path = os.path.join(self.out_dir, f"rank{self.global_rank}.txt")

        def show(message, category, *args, **kwargs):
            if category.__name__ == "XLAGraphReportWarning":
                with open(path, "a") as f:
                    f.write(str(message) + "\\n@@\\n")

        warnings.showwarning = show
        warnings.simplefilter("always")

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.value = loss.item()  # the read
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
'''


@RunIf(xla=True)
@pytest.mark.slow
def test_tpu_spawn_reports_from_rank_zero(tmp_path, fork_server):
    """``tpu_spawn`` with 2 processes (the simulated TPU host of ``helpers/gloo_xla_collectives.py``): rank 0 reports
    the ``.item()`` line, rank 1 measures too but says nothing. (The harness carries every all-reduce through the
    host, a round trip that a TPU keeps in the graph: the report names that too, in the harness's file.)"""
    from helpers.xla_subprocess import run_python

    tests_dir = str(Path(__file__).resolve().parents[2])
    (tmp_path / "graph_report_spawn_module.py").write_text(_SPAWN_MODULE)
    code = f"""
        import os, sys
        sys.path[:0] = [{tests_dir!r}, {str(tmp_path)!r}]
        from helpers import multiprocess_scenarios as scenarios
        from graph_report_spawn_module import ItemModule

        out = {str(tmp_path)!r}
        with scenarios._host(out):
            trainer = scenarios.spawn_trainer(out, max_steps=10)
            trainer.fit(ItemModule(out), scenarios.loader(rows=160))
        emit({{"strategy": type(trainer.strategy).__name__,
              "ranks": [open(os.path.join(out, f"rank{{r}}.txt")).read() if os.path.exists(os.path.join(out,
                        f"rank{{r}}.txt")) else "" for r in (0, 1)]}})
    """
    out = run_python(code, env={"PJRT_DEVICE": None, "CPU_NUM_DEVICES": None}, timeout=300, fork_server=fork_server)
    assert out["strategy"] == "TPUSpawnStrategy"
    rank0, rank1 = out["ranks"]
    assert rank1 == ""
    reports = [r for r in rank0.split("\n@@\n") if r.strip()]
    assert len(reports) == 1, reports
    line = next(i + 1 for i, text in enumerate(_SPAWN_MODULE.splitlines()) if "# the read" in text)
    module_file = tmp_path / "graph_report_spawn_module.py"
    assert f"{module_file}:{line} in training_step" in reports[0]
    assert "(rank 0," in reports[0] and "Tensor.item" in reports[0]
