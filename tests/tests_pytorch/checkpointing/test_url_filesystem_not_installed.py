"""A checkpoint URL whose ``fsspec`` filesystem is not installed (``gs://`` without ``gcsfs``) is refused when the
``Trainer`` or ``ModelCheckpoint`` is built, with a ``MisconfigurationException`` that names the package to install,
instead of an ``ImportError`` at the first use or no error at all until the first write.

The missing package is real: ``gcsfs`` is made unimportable in this process (``sys.modules["gcsfs"] = None``, and
fsspec forgets the class it may have loaded already), and a protocol registered with fsspec names a package that
does not exist.
"""
import os
import sys

import fsspec
import pytest
from fsspec.registry import _registry, known_implementations, register_implementation

from pytorch_lightning import Trainer
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.exceptions import MisconfigurationException

FIXED_BY = "0055-url-filesystem-not-installed-is-a-clear-error.patch"


@pytest.fixture
def without_gcsfs(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` raises ImportError
    for protocol in ("gs", "gcs"):
        monkeypatch.delitem(_registry, protocol, raising=False)


@pytest.fixture
def unimportable_protocol(monkeypatch):
    """A protocol ``lightningtestfs://`` that fsspec knows, implemented by a package that is not installed."""
    monkeypatch.setitem(known_implementations, "lightningtestfs", {})
    register_implementation("lightningtestfs", "lightning_missing_fs_package.FileSystem", clobber=True,
                            errtxt="Install lightning-missing-fs-package to access lightningtestfs")
    monkeypatch.delitem(_registry, "lightningtestfs", raising=False)
    return "lightningtestfs"


def test_model_checkpoint_names_the_package_of_a_missing_filesystem(without_gcsfs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MisconfigurationException) as err:
        ModelCheckpoint(dirpath="gs://bucket/run")
    message = str(err.value)
    assert message.startswith("`ModelCheckpoint(dirpath=...)` is 'gs://bucket/run', but the filesystem of `gs://` URLs")
    assert message.endswith("Install the package `gcsfs` (`pip install gcsfs`).")
    assert os.listdir(tmp_path) == []  # nothing named after the URL


def test_trainer_names_the_package_of_a_missing_filesystem(without_gcsfs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MisconfigurationException) as err:
        # no logger: nothing else would touch `default_root_dir` before the first save
        Trainer(default_root_dir="gs://bucket/run", logger=False, enable_checkpointing=False)
    message = str(err.value)
    assert message.startswith("`Trainer(default_root_dir=...)` is 'gs://bucket/run', but the filesystem of `gs://`")
    assert "Install the package `gcsfs` (`pip install gcsfs`)." in message
    assert os.listdir(tmp_path) == []


def test_the_package_comes_from_fsspec_s_registry(unimportable_protocol, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"{unimportable_protocol}://bucket/run"
    for build in (lambda: ModelCheckpoint(dirpath=url), lambda: Trainer(default_root_dir=url, logger=False)):
        with pytest.raises(MisconfigurationException) as err:
            build()
        message = str(err.value)
        # fsspec's own hint, then the package named by the registered class
        assert "(Install lightning-missing-fs-package to access lightningtestfs)" in message
        assert message.endswith("Install the package `lightning_missing_fs_package` (`pip install "
                                "lightning_missing_fs_package`).")
    assert os.listdir(tmp_path) == []


@pytest.mark.guard
def test_installed_filesystems_and_local_paths_pass(tmp_path):
    """Guard: a URL whose filesystem is installed, and a local path, are accepted as before."""
    ModelCheckpoint(dirpath="memory://run/checkpoints")
    ModelCheckpoint(dirpath=str(tmp_path / "checkpoints"))
    assert Trainer(default_root_dir="memory://run", logger=False).default_root_dir == "memory://run"
    assert fsspec.filesystem("memory").exists("/run") is False  # building them wrote nothing

