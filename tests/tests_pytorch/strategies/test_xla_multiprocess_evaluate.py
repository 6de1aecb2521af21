"""``validate``, ``test`` and ``predict`` with two XLA processes: every rank's predictions reach the user.

Two processes through the simulated TPU host of ``helpers/gloo_xla_collectives.py``. Before the fix
``trainer.predict`` returned ``None`` under ``TPUSpawnStrategy`` (spawn strategies turned ``return_predictions``
off).
"""
import pytest
import torch

from helpers.multiprocess_scenarios import check_identical_sequences, run_scenario
from helpers.runif import RunIf

FIXED_BY = "0026-tpu-spawn-predict-returns-every-rank-s-predictions.patch"


@RunIf(xla=True)
@pytest.mark.slow
def test_validate_test_predict_equal_one_process(tmp_path, fork_server):
    result = run_scenario("evaluate", str(tmp_path), fork_server=fork_server)
    check_identical_sequences(result["records"])
    xla, cpu = result["xla"], result["cpu"]
    # the logged values are synced over both ranks: those of one process on all the rows
    assert xla["validate"] == [pytest.approx({"val_loss": cpu["val_loss"], "val_acc": cpu["val_acc"]}, abs=1e-6)]
    assert xla["test"] == [pytest.approx({"test_loss": cpu["val_loss"]}, abs=1e-6)]
    # every batch of every rank, batch k of rank 0 then batch k of rank 1: all 48 rows once
    assert len(xla["predict"]) == len(cpu["predict"]) == 12
    for got, expected in zip(xla["predict"], cpu["predict"]):
        assert torch.allclose(torch.tensor(got), torch.tensor(expected), atol=1e-6)
