"""The tqdm bars redraw at most once per their ``mininterval``, as tqdm's own ``update`` does, and always when full.

Lightning sets each bar's count and calls ``refresh`` itself, which bypasses tqdm's limit: a fast loop formatted and
wrote the bar on every batch, on the training thread. The counts are still set on every batch, and what a redraw
shows is unchanged; only redraws that nobody could read in between go.
"""
import pytest
import torch

FIXED_BY = "0038-progress-bar-redraws-at-most-once-per-mininterval.patch"

TRAIN_BATCHES = 12
VAL_BATCHES = 4


def _fit(tmp_path, mininterval, val_batches=0):
    from pytorch_lightning import Trainer, seed_everything
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.demos.boring_classes import BoringModel

    seed_everything(7)
    frames = {"train": [], "val": []}
    counts = []

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("step_loss", out["loss"], prog_bar=True)
            return out

    def recorded(bar, name):
        bar.mininterval = mininterval
        real_refresh = bar.refresh

        def refresh(*args, **kwargs):
            frames[name].append((bar.n, bar.postfix))
            return real_refresh(*args, **kwargs)

        bar.refresh = refresh
        return bar

    class Bar(TQDMProgressBar):
        def init_train_tqdm(self):
            return recorded(super().init_train_tqdm(), "train")

        def init_validation_tqdm(self):
            return recorded(super().init_validation_tqdm(), "val")

        def on_train_batch_end(self, *args, **kwargs):
            super().on_train_batch_end(*args, **kwargs)
            counts.append(self.main_progress_bar.n)

    trainer = Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=TRAIN_BATCHES,
        limit_val_batches=val_batches,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[Bar()],
    )
    trainer.fit(Model())
    return frames, counts, trainer


def test_training_bar_redraws_at_most_once_per_mininterval(tmp_path):
    frames, counts, _ = _fit(tmp_path, mininterval=3600)
    # the count is still set on every batch
    assert counts == list(range(1, TRAIN_BATCHES + 1))
    drawn = [n for n, _ in frames["train"]]
    # within the hour: the first batch (nothing drawn before it), then only the full bar (its last batch and the
    # epoch end's final metrics); without the limit every batch was a redraw
    assert set(drawn) <= {0, 1, TRAIN_BATCHES}, drawn
    assert drawn[-1] == TRAIN_BATCHES
    assert not [n for n in drawn if 1 < n < TRAIN_BATCHES]


def test_validation_bars_redraw_at_most_once_per_mininterval(tmp_path):
    frames, _, _ = _fit(tmp_path, mininterval=3600, val_batches=VAL_BATCHES)
    total = TRAIN_BATCHES + VAL_BATCHES
    # the main bar counts the validation batches too; in between its first batch and full, nothing is drawn
    assert not [n for n, _ in frames["train"] if 1 < n < total], frames["train"]
    assert frames["train"][-1][0] == total
    assert not [n for n, _ in frames["val"] if 1 < n < VAL_BATCHES], frames["val"]


@pytest.mark.guard
def test_the_full_bar_shows_what_every_batch_redraws_showed(tmp_path):
    every, every_counts, every_trainer = _fit(tmp_path / "every", mininterval=0)
    limited, limited_counts, limited_trainer = _fit(tmp_path / "limited", mininterval=3600)
    # with no interval each batch still redraws once (the user's `mininterval=0` brings every redraw back)
    assert [n for n, _ in every["train"] if 1 <= n < TRAIN_BATCHES] == list(range(1, TRAIN_BATCHES))
    assert every_counts == limited_counts
    # the last frame (count and metrics) is the same, and so is what the Trainer reports
    assert every["train"][-1] == limited["train"][-1]
    assert "step_loss" in limited["train"][-1][1]
    for key, value in every_trainer.progress_bar_metrics.items():
        assert limited_trainer.progress_bar_metrics[key] == pytest.approx(value, abs=0.0), key
    assert torch.equal(every_trainer.callback_metrics["step_loss"], limited_trainer.callback_metrics["step_loss"])
