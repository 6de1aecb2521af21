"""The training bar formats the step's metrics into its postfix only when it is redrawn.

Between two redraws (at most one per ``mininterval``) nothing shows the postfix, so formatting it on every batch was
work for nothing. ``get_metrics`` is still called on every batch: it is a public hook, and each redraw shows the
metrics of the batch it is drawn at.
"""
import io

import pytest

FIXED_BY = "0044-progress-bar-formats-metrics-only-to-redraw.patch"

BATCHES = 10


def _fit(tmp_path, mininterval):
    from pytorch_lightning import Trainer, seed_everything
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.demos.boring_classes import BoringModel

    seed_everything(3)
    record = {"postfix_calls": [], "frames": [], "metrics": {}}

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("step_loss", out["loss"], prog_bar=True)
            return out

    class Bar(TQDMProgressBar):
        def init_train_tqdm(self):
            bar = super().init_train_tqdm()
            bar.mininterval = mininterval
            set_postfix, refresh = bar.set_postfix, bar.refresh

            def counted_set_postfix(*args, **kwargs):
                record["postfix_calls"].append(bar.n)
                return set_postfix(*args, **kwargs)

            def recorded_refresh(*args, **kwargs):
                record["frames"].append((bar.n, bar.postfix))
                return refresh(*args, **kwargs)

            bar.set_postfix, bar.refresh = counted_set_postfix, recorded_refresh
            return bar

        def get_metrics(self, trainer, pl_module):
            metrics = super().get_metrics(trainer, pl_module)
            if trainer.training:
                record["metrics"][self.train_batch_idx] = dict(metrics)
            return metrics

    trainer = Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=BATCHES,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[Bar()],
    )
    trainer.fit(Model())
    return record


def _formatted(metrics):
    """The postfix the progress bar's tqdm makes of ``metrics``."""
    from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm

    bar = Tqdm(total=1, file=io.StringIO())
    bar.set_postfix(metrics, refresh=False)
    text = bar.postfix
    bar.close()
    return text


def test_metrics_formatted_only_for_a_redraw(tmp_path):
    record = _fit(tmp_path, mininterval=3600)
    # within the hour the bar is drawn at its first batch and when full; the metrics are formatted for those two
    # redraws and once more at the epoch's end. Before, they were formatted on every batch
    in_batches = [n for n in record["postfix_calls"] if n < BATCHES]
    assert in_batches == [1], record["postfix_calls"]
    # `get_metrics` still runs on every batch
    assert sorted(record["metrics"]) == list(range(1, BATCHES + 1))


@pytest.mark.guard
def test_each_redraw_shows_the_metrics_of_its_batch(tmp_path):
    record = _fit(tmp_path, mininterval=0)
    drawn = [(n, postfix) for n, postfix in record["frames"] if 1 <= n <= BATCHES]
    assert [n for n, _ in drawn][: BATCHES] == list(range(1, BATCHES + 1))
    for n, postfix in drawn[:BATCHES]:
        assert postfix == _formatted(record["metrics"][n]), n
