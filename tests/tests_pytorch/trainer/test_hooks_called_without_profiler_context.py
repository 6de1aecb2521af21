"""With the default profiler, which records nothing, the Trainer calls each hook directly.

It used to build the profiler's action name for every hook call (for a callback that includes its ``state_key``,
which ``ModelCheckpoint`` computes from all its arguments) and enter a context that does nothing. A profiler that
records still gets every action, named as before.
"""
import pytest

FIXED_BY = "0040-trainer-calls-hooks-without-profiler-context.patch"

BATCHES = 4


def _fit(tmp_path, profiler=None):
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel

    reads = []

    class KeyedCallback(Callback):
        """A callback that counts how often its ``state_key`` is read during the training batches."""

        in_batches = False

        @property
        def state_key(self):
            if self.in_batches:
                reads.append(1)
            return self._generate_state_key(name="keyed")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.in_batches = True

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.in_batches = batch_idx < BATCHES - 1

    trainer = Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        profiler=profiler,
        callbacks=[KeyedCallback()],
    )
    trainer.fit(BoringModel())
    return trainer, reads


def test_default_profiler_builds_no_action_names(tmp_path, monkeypatch):
    from pytorch_lightning.profilers import PassThroughProfiler

    entered = []
    profile = PassThroughProfiler.profile

    def counted(self, action_name):
        entered.append(action_name)
        return profile(self, action_name)

    monkeypatch.setattr(PassThroughProfiler, "profile", counted)
    _, reads = _fit(tmp_path)
    # before: every hook call of the loops went through `profile`, with the callback's `state_key` in its name
    assert [name for name in entered if "on_train_batch" in name or "training_step" in name] == []
    assert reads == []


@pytest.mark.guard
def test_a_recording_profiler_gets_every_action(tmp_path):
    from pytorch_lightning.profilers import SimpleProfiler

    profiler = SimpleProfiler()
    _, reads = _fit(tmp_path, profiler=profiler)
    recorded = set(profiler.recorded_durations)
    assert [k for k in recorded if k.startswith("[Callback]") and k.endswith("{'name': 'keyed'}.on_train_batch_end")]
    assert "[LightningModule]BoringModel.optimizer_step" in recorded
    assert "[Strategy]SingleDeviceStrategy.training_step" in recorded
    assert len(profiler.recorded_durations["[Strategy]SingleDeviceStrategy.training_step"]) == BATCHES
    # the action names still hold the callback's state key
    assert reads
