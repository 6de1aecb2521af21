"""The installed distribution is the fork: its version names the series, and it trains."""
import importlib.metadata
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION_RE = re.compile(r"^1\.8\.6\+xla\.\d+\.g[0-9a-f]{8}$")


def test_version_names_the_fork_and_its_series():
    import lightning_lite
    import pytorch_lightning

    assert VERSION_RE.match(pytorch_lightning.__version__), pytorch_lightning.__version__
    assert importlib.metadata.version("pytorch-lightning") == pytorch_lightning.__version__
    assert lightning_lite.__version__ == pytorch_lightning.__version__


def test_installed_fork_is_the_current_series():
    """Guards against testing a stale install: the version digest covers every patch of the series."""
    import pytorch_lightning

    sys.path.insert(0, str(REPO / "tools"))
    from forkq.tree import fork_version

    if Path(pytorch_lightning.__file__).resolve().is_relative_to(REPO / "build"):
        pytest.skip("running against a partial tree of the series (before/after check)")
    assert pytorch_lightning.__version__ == fork_version()


def test_trains_on_cpu(tmp_path):
    import torch
    from pytorch_lightning import LightningModule, Trainer

    class Model(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)

    model = Model()
    before = model.layer.weight.detach().clone()
    trainer = Trainer(accelerator="cpu", max_steps=2, default_root_dir=tmp_path, enable_progress_bar=False,
                      enable_model_summary=False, logger=False, enable_checkpointing=False)
    trainer.fit(model)
    assert trainer.global_step == 2
    assert not torch.equal(before, model.layer.weight)
