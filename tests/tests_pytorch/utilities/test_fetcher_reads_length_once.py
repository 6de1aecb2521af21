"""A sized dataloader's length is read once per pass over it, not for every batch.

Without prefetching (a sized training dataloader), ``DataFetcher`` knows it is done when it has fetched as many
batches as the dataloader has; it computed that length again for every batch, through ``CombinedLoader`` and every
loader it wraps. The length cannot change while the dataloader is iterated, and a new pass reads it again.
"""
import pytest
from torch.utils.data import DataLoader

FIXED_BY = "0043-data-fetcher-reads-length-once-per-pass.patch"

BATCHES = 6
EPOCHS = 2


def _fit(tmp_path, lengths):
    from pytorch_lightning import Callback, Trainer
    from pytorch_lightning.demos.boring_classes import BoringModel, RandomDataset

    window = {"open": False}

    class CountingLoader(DataLoader):
        def __len__(self):
            length = super().__len__()
            if window["open"]:
                lengths.append(length)
            return length

    class Window(Callback):
        """Counts the reads made while an epoch's batches run (after its first batch started)."""

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            window["open"] = True

        def on_train_epoch_end(self, trainer, pl_module):
            window["open"] = False

    seen = []

    class Model(BoringModel):
        def training_step(self, batch, batch_idx):
            seen.append((self.current_epoch, batch_idx))
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            return CountingLoader(RandomDataset(32, BATCHES * 2), batch_size=2)

    trainer = Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=EPOCHS, limit_val_batches=0,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, callbacks=[Window()])
    trainer.fit(Model())
    return seen


def test_length_not_read_for_every_batch(tmp_path):
    lengths = []
    _fit(tmp_path, lengths)
    # before: one read per fetched batch after the first, in every epoch
    assert lengths == []


@pytest.mark.guard
def test_every_epoch_sees_every_batch_once(tmp_path):
    seen = _fit(tmp_path, [])
    assert seen == [(epoch, i) for epoch in range(EPOCHS) for i in range(BATCHES)]


@pytest.mark.guard
def test_a_fetcher_reads_the_length_again_on_a_new_pass():
    from pytorch_lightning.utilities.fetching import DataFetcher

    data = list(range(4))
    fetcher = DataFetcher(prefetch_batches=0)
    fetcher.setup(DataLoader(data, batch_size=None))
    assert [int(x) for x in fetcher] == data and fetcher.done
    data.extend([4, 5])
    # the next pass reads the new length, and stops after the last element
    assert [int(x) for x in fetcher] == data and fetcher.done
