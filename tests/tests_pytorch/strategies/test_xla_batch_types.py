"""The steps get the batches as the user built them (fix `xla-single-device-batches-copied-on-loader-threads`): on one
XLA device and with several XLA processes (``tpu_spawn``, gloo harness), ``training_step``, ``validation_step``,
``test_step`` and ``predict_step`` get namedtuples, tuples, dict subclasses, dataclasses, objects with their own
``.to()``, nested mixtures, strings and other leaves with the types that upstream's ``move_data_to_device`` keeps, every
tensor on the device; so do the batches of a Lite dataloader. torch_xla's ``MpDeviceLoader`` (``xm.send_cpu_data_to_
device``), which ``tpu_spawn`` used, turns tuples and namedtuples into lists and dict subclasses into dicts. The SPMD
strategies: ``test_xla_spmd.py``."""
import pytest

from helpers.runif import RunIf
from helpers.xla_batch_types import expected_layout, HOOKS, lite_layouts, trainer_kwargs, trainer_run
from helpers.xla_waits import _graph_report_off

FIXED_BY = "0061-xla-single-device-batches-copied-on-loader-threads.patch"


@pytest.mark.guard  # upstream's behaviour, kept on one device before the fix too (the batches came on the host)
@RunIf(xla=True)
def test_the_steps_on_one_device_get_the_batches_as_built(tmp_path):
    from pytorch_lightning import Trainer

    with _graph_report_off():
        seen = trainer_run(lambda **kwargs: Trainer(accelerator="tpu", devices=1, **trainer_kwargs(str(tmp_path)),
                                                    **kwargs))
        lite = lite_layouts(accelerator="tpu", devices=1)
    assert {hook: seen.get(hook) for hook in HOOKS} == {hook: [expected_layout()] for hook in HOOKS}
    assert lite == [expected_layout()]


@pytest.mark.slow  # two spawned processes per stage, through the harness
@RunIf(xla=True)
def test_the_steps_of_every_xla_process_get_the_batches_as_built(tmp_path, fork_server):
    """``Trainer(accelerator="tpu", devices="auto")`` (``tpu_spawn``) and Lite's XLA strategy on a host of two
    simulated chips: every rank's steps and Lite loop get the user's types."""
    from helpers.multiprocess_scenarios import run_scenario, WORLD_SIZE

    result = run_scenario("batch_types", str(tmp_path), fork_server=fork_server)
    assert result["strategy"] == "TPUSpawnStrategy"
    expected = {hook: [expected_layout()] for hook in HOOKS}
    assert result["ranks"] == [expected] * WORLD_SIZE
    assert result["lite"] == [[expected_layout()]] * WORLD_SIZE
