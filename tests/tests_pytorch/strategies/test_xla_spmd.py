"""The Trainer's SPMD data parallel strategy, ``strategy="xla_spmd"``, on 4 XLA:CPU devices driven by one process:
the XLA partitioner and its collectives run for real. The tests that hold for every SPMD strategy are parametrized
over ``"xla_spmd"`` and ``"xla_spmd_fsdp"`` here; what only FSDPv2 does is in ``test_xla_spmd_fsdp.py``. (``FIXED_BY``
names the feature patch of ``"xla_spmd"``; both strategies come from feature patches, so no before/after check runs
these.)

The runs (``helpers/xla_spmd_fixtures.py``) each have a process of their own (the device count is fixed per process,
and SPMD cannot be turned off once on): the reference on one XLA device, then each strategy on 4. All train the same
model on the same global batches (the dataloader's batch is the host's global batch) for 12 steps in three ways
(``gradient_clip_val`` with a progress-bar loss; the same with ``accumulate_grad_batches=2``; manual optimization
with two optimizers, each clipped by the norm), validate, and resume a second epoch from the one-device run's
checkpoint. The SPMD runs must reach the one-device weights, validation loss and progress-bar loss, cost what the
one-device run costs per steady step (0 compilations, 1 graph, at most 1 transfer), and shard as promised.
"""
import pytest
import torch

from helpers.runif import RunIf
from helpers.xla_spmd_checks import check_sharded_checkpoint_versions, DEVICES, max_difference, TOLERANCE

FIXED_BY = "0050-feature-xla-spmd-strategy.patch"

SCENARIOS = ("clip", "accumulate", "manual", "resume")
STRATEGIES = pytest.mark.parametrize("strategy", ["xla_spmd", "xla_spmd_fsdp"])


@RunIf(xla=True)
@STRATEGIES
def test_spmd_reaches_the_one_device_weights(spmd_one_device, spmd_runs, strategy):
    runs = spmd_runs(strategy)["runs"]
    for scenario in SCENARIOS:
        ref, run = spmd_one_device["runs"][scenario], runs[scenario]
        assert max_difference(ref["weights"], run["weights"]) < TOLERANCE, scenario
        assert run["val_loss"] == pytest.approx(ref["val_loss"], abs=TOLERANCE), scenario
        assert run["progress_bar_loss"] == pytest.approx(ref["progress_bar_loss"], abs=TOLERANCE), scenario
    # the training moved the weights: equal weights are not the initial ones
    assert max_difference(runs["clip"]["weights"], runs["resume"]["weights"]) > 1e-3


@RunIf(xla=True)
@STRATEGIES
def test_spmd_steady_steps_cost_what_one_device_costs(spmd_one_device, spmd_runs, strategy):
    """Per steady-state training batch: 0 compilations, 1 graph (forward, backward, clipping, update and the
    progress bar's loss, whatever the number of optimizers), at most 1 device-to-host transfer (the step's logged
    values); per validation batch 0 compilations and 1 graph. Exactly what one device costs."""
    runs = spmd_runs(strategy)["runs"]
    for scenario in SCENARIOS:
        train, ref = runs[scenario]["train"], spmd_one_device["runs"][scenario]["train"]
        assert train["compiles"] == 0, scenario
        assert train["executions"] == 1, scenario
        assert train["transfers"] <= 1, scenario
        assert train == ref, scenario
        assert runs[scenario]["val"]["compiles"] == 0 and runs[scenario]["val"]["executions"] == 1, scenario
        assert runs[scenario]["val"] == spmd_one_device["runs"][scenario]["val"], scenario
    # the one-device reference itself: the progress bar's loss is read once per step
    assert spmd_one_device["runs"]["clip"]["train"] == {"compiles": 0, "executions": 1, "transfers": 1}


@RunIf(xla=True)
def test_data_parallel_replicates_parameters_and_optimizer_state(spmd_runs):
    run = spmd_runs("xla_spmd")["runs"]["manual"]
    for name, info in run["sharding"].items():
        assert info["spec"] == "{replicated}", name
        assert info["shards"] == [info["shape"]] * DEVICES, name
    assert run["optimizer_state"] and all(s["spec"] == "{replicated}" for s in run["optimizer_state"])


@RunIf(xla=True)
@STRATEGIES
def test_spmd_everyday_patterns_cost_what_one_device_costs(spmd_one_device, spmd_runs, strategy):
    """bf16, a torchmetrics metric logged on step and epoch, a progress-bar loss and clipping, then ``Trainer.test``
    and ``Trainer.predict``: no compilation in the steady state and the graphs and transfers of one device, the same
    metric, test loss and predictions."""
    run, ref = spmd_runs(strategy)["runs"]["patterns"], spmd_one_device["runs"]["patterns"]
    assert run["dtype"] == ref["dtype"] == "torch.bfloat16"
    for stage in ("train", "test", "predict"):
        assert run[stage] == ref[stage], stage
        assert run[stage]["compiles"] == 0, stage
    # one graph per test and predict batch; the training step with a logged torchmetrics metric costs 2 graphs and 2
    # transfers on one device already (1 each without the metric, see the "clip" scenario), and the same under SPMD
    assert run["test"]["executions"] == run["predict"]["executions"] == 1
    assert run["test"]["transfers"] <= 1 and run["predict"]["transfers"] <= 1
    assert run["train"] == {"compiles": 0, "executions": 2, "transfers": 2}
    assert run["accuracy"] == ref["accuracy"]
    assert run["predictions"] == ref["predictions"]
    assert abs(run["test_loss"] - ref["test_loss"]) < 1e-3  # bf16


@RunIf(xla=True)
@STRATEGIES
def test_spmd_ctrl_c_and_the_xla_profiler(spmd_runs, strategy):
    """Ctrl-C stops the run cleanly (status INTERRUPTED after the 4 steps), and the same process then trains a whole
    epoch with ``profiler="xla"`` and validation."""
    run = spmd_runs(strategy)["runs"]["interrupt_and_profile"]
    assert run["interrupted"] is True and run["interrupted_status"] == "TrainerStatus.INTERRUPTED"
    assert run["interrupted_steps"] == 4
    assert run["profiled_steps"] == 12 and run["profiled_val_loss"] > 0


@RunIf(xla=True)
@STRATEGIES
def test_spmd_sharded_checkpoint(spmd_one_device, spmd_runs, strategy):
    """``state_dict_type="sharded"`` on the local disk: the versions and commit markers above, and resuming from the
    checkpoint (past the killed save's uncommitted version) gives the one-device second epoch (so the momentum came
    back too) and the callback state."""
    run = spmd_runs(strategy)["runs"]["sharded"]
    check_sharded_checkpoint_versions(run, strategy)
    assert run["path"].startswith("/")
    assert max_difference(spmd_one_device["runs"]["clip"]["weights"], run["first_weights"]) < TOLERANCE
    assert max_difference(spmd_one_device["runs"]["resume"]["weights"], run["resumed_weights"]) < TOLERANCE


@RunIf(xla=True)
@STRATEGIES
def test_the_partitioned_step_holds_the_collectives(spmd_runs, strategy):
    """Read in the HLO that XLA compiled for the 4 devices during the "clip" run (training, validation, checkpoint):
    data parallel all-reduces (gradients, loss) and gathers nothing, since every device holds every parameter;
    FSDPv2 all-gathers the sharded parameters where the step uses them."""
    modules = spmd_runs(strategy)["runs"]["clip"]["collectives"]
    steps = [m for m in modules if "SyncTensorsGraph" in m["file"]]
    assert steps, modules
    assert max(m["all-reduce"] for m in steps) > 0
    if strategy == "xla_spmd":
        assert all(m["all-gather"] == 0 for m in modules), modules
    else:
        assert any(m["all-gather"] > 0 and m["all-reduce"] > 0 for m in steps), modules


@RunIf(xla=True)
@STRATEGIES
def test_spmd_checkpoint_is_a_full_state_dict_that_one_device_loads(spmd_one_device, spmd_runs, strategy):
    """The ``.ckpt`` an SPMD run writes holds whole, unsharded CPU tensors under the plain model's names: a model
    without SPMD loads it, and it holds the weights the one-device run had after the same epoch."""
    path = spmd_runs(strategy)["runs"]["clip"]["checkpoint"]
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    state = checkpoint["state_dict"]
    assert all(t.device.type == "cpu" for t in state.values())
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    net.load_state_dict({k[len("net."):]: v for k, v in state.items()})
    ref = spmd_one_device["runs"]["clip"]["weights"]
    assert max_difference(ref, {k: v.tolist() for k, v in state.items()}) < TOLERANCE
    assert checkpoint["optimizer_states"][0]["state"][0]["momentum_buffer"].shape == (32, 16)
    # and Lightning's own loader, in this process, which never enabled SPMD
    from helpers.xla_spmd_runs import _module

    model = type(_module("clip", {})).load_from_checkpoint(path, map_location="cpu")
    assert max_difference(ref, {k: v.tolist() for k, v in model.state_dict().items()}) < TOLERANCE


@RunIf(xla=True)
@STRATEGIES
def test_resume_into_spmd_keeps_the_callback_state(spmd_one_device, spmd_runs, strategy):
    """Resumed into SPMD from the one-device checkpoint, ``ModelCheckpoint`` gets the first run's best model back
    (the checkpoint's ``callbacks`` key survived), and the second epoch equals the one-device resumed run (checked
    with the weights above)."""
    resumed = spmd_runs(strategy)["runs"]["resume"]
    first = spmd_one_device["runs"]["clip"]["checkpoint"]
    assert first.endswith("epoch=0-step=12.ckpt")
    assert resumed["restored_best_model_path"] == first
    assert resumed["best_k_models"][0].endswith("epoch=1-step=24.ckpt")


@RunIf(xla=True)
@STRATEGIES
def test_spmd_misconfigurations_are_clear_errors(spmd_runs, strategy):
    errors = spmd_runs(strategy)["errors"]
    # 6 samples on 4 devices: the loader's batch is the host's global batch
    assert "A batch of 6 samples" in errors["indivisible_batch"] and "multiple of 4" in errors["indivisible_batch"]
    assert "holds 3 devices, but this process drives 4 XLA devices" in errors["mesh_shape"]
    assert "SPMD drives every XLA device of the process, 4 here, but `devices=1`" in errors["devices"]
    assert errors["default"] == ""


@RunIf(xla=True)
def test_spmd_after_one_device_run_is_refused(spmd_one_device):
    """In a process that has XLA tensors already (it trained on one device), SPMD comes too late: a clear error, not
    torch_xla's forced replication (which crashed the process with a segmentation fault)."""
    # (`devices=1` is all there is in that process)
    for case in ("indivisible_batch", "mesh_shape", "default"):
        error = spmd_one_device["errors"][case]
        assert "SPMD must be enabled before the first XLA tensor of the process exists" in error


def test_mesh_and_axis_validation():
    """Checked when the strategy is created, without starting anything."""
    pytest.importorskip("torch_xla")
    from pytorch_lightning.strategies import StrategyRegistry, XLASPMDStrategy
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match="one name per axis"):
        XLASPMDStrategy(mesh_shape=(2, 2))
    with pytest.raises(MisconfigurationException, match="must name one or more axes of the mesh"):
        XLASPMDStrategy(axis_names=("data",), batch_axes=("model",))
    with pytest.raises(MisconfigurationException, match="choose 'full'"):
        XLASPMDStrategy(state_dict_type="distributed")
    strategy = XLASPMDStrategy(mesh_shape=(2, 2), axis_names=("data", "model"), batch_axes=("data",))
    assert strategy.batch_axes == ("data",)
    assert XLASPMDStrategy().axis_names == ("data",) and XLASPMDStrategy().batch_axes == ("data",)
    assert isinstance(StrategyRegistry.get("xla_spmd"), XLASPMDStrategy)


def test_spmd_needs_the_tpu_accelerator(tmp_path):
    """Any other accelerator is refused before SPMD is switched on (so this process stays as it was)."""
    pytest.importorskip("torch_xla")
    from helpers.xla_spmd_runs import _module
    from pytorch_lightning import Trainer
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    trainer = Trainer(accelerator="cpu", strategy="xla_spmd", max_steps=1, default_root_dir=tmp_path, logger=False,
                      enable_checkpointing=False)
    with pytest.raises(MisconfigurationException, match="runs on XLA devices, but the accelerator is `CPUAccelerator`"):
        trainer.fit(_module("clip", {}))


@RunIf(xla=True)
@STRATEGIES
def test_spmd_steps_get_the_batches_as_the_user_built_them(spmd_runs, strategy):
    """``training_step``, ``validation_step``, ``test_step`` and ``predict_step``, and a Lite dataloader of the same
    strategy, get namedtuples, tuples, dict subclasses, dataclasses, objects with their own ``.to()``, nested
    mixtures, strings and other leaves as upstream's ``move_data_to_device`` keeps them, every tensor on the device
    (``helpers.xla_batch_types``)."""
    from helpers.xla_batch_types import expected_layout, HOOKS

    run = spmd_runs(strategy)["runs"]["batch_types"]
    assert run["trainer"] == {hook: [expected_layout()] for hook in HOOKS}
    assert run["lite"] == [expected_layout()]
