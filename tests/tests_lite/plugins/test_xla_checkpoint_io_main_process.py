"""``XLACheckpointIO`` in a process whose XLA runtime has not started (the main process after ``xmp.spawn``'s workers
finished): it saves through ``TorchCheckpointIO``, callbacks included, without starting the runtime (patch
`compat-pjrt-launchers-and-strategies`)."""
import pytest

from helpers.xla_subprocess import run_python

pytest.importorskip("torch_xla")


def test_save_without_the_runtime_keeps_everything_and_starts_nothing(tmp_path):
    path = str(tmp_path / "main.ckpt")
    out = run_python(
        f"""
        import torch, torch_xla
        from lightning_lite.plugins import XLACheckpointIO

        XLACheckpointIO().save_checkpoint(
            {{"state_dict": {{"w": torch.ones(2)}}, "callbacks": {{"ModelCheckpoint{{}}": {{"best_model_score": 0.4}}}}}},
            {path!r},
        )
        saved = torch.load({path!r})
        emit({{"keys": sorted(saved), "callbacks": saved["callbacks"],
               "runtime started": torch_xla._XLAC._xla_runtime_is_initialized()}})
        """,
        env={"PJRT_DEVICE": "CPU"},
    )
    assert out == {
        "keys": ["callbacks", "state_dict"],
        "callbacks": {"ModelCheckpoint{}": {"best_model_score": 0.4}},
        "runtime started": False,
    }
