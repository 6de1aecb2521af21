"""The training progress bar redraws once per step, showing the step's count and metrics together."""
import pytest

from helpers.runif import RunIf
from helpers.xla_recording import fit_on_xla

FIXED_BY = "0035-progress-bar-one-redraw-per-batch.patch"


def _bar_and_model(frames):
    from pytorch_lightning.callbacks import TQDMProgressBar
    from pytorch_lightning.demos.boring_classes import BoringModel

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("step_loss", out["loss"], prog_bar=True)
            return out

    class Bar(TQDMProgressBar):
        def init_train_tqdm(self):
            bar = super().init_train_tqdm()
            # no time limit between redraws: every step may redraw, and must do so at most once
            bar.mininterval = 0
            real_refresh = bar.refresh

            def refresh(*args, **kwargs):
                frames.append((bar.n, dict(bar.postfix and [kv.split("=") for kv in bar.postfix.split(", ")] or [])))
                return real_refresh(*args, **kwargs)

            bar.refresh = refresh
            return bar

    return Model(), Bar()


@RunIf(xla=True)
def test_one_redraw_per_training_step(tmp_path):
    frames = []
    model, bar = _bar_and_model(frames)
    trainer = fit_on_xla(model, tmp_path, max_steps=6, limit_train_batches=6, callbacks=[bar], enable_progress_bar=True)
    steps = [f for f in frames if f[0] >= 1]
    # one redraw per step, each with its own count
    assert [n for n, _ in steps][:6] == [1, 2, 3, 4, 5, 6], frames
    # every redraw shows a logged value (the last one: what the bar shows at the end); on XLA the bar gets a step's
    # values one step later, so the first redraw may come before any value reached the host
    assert all("step_loss" in postfix for _, postfix in steps[1:])
    shown = float(steps[-1][1]["step_loss"])  # three significant digits, as the bar formats it
    assert shown == pytest.approx(trainer.progress_bar_metrics["step_loss"], rel=5e-3)
