"""Build the Lightning XLA fork: upstream pytorch-lightning 1.8.6 plus ``patches/1.8.6/series``.

``src/`` is generated. When it is missing or stale (a clean checkout, ``pip install git+...``, an sdist), the build
runs ``fork.py materialize`` (``tools/forkq``) first, which downloads the pinned upstream wheel through pip, checks its sha256 and
applies the series. A ``src/`` edited by hand builds as ``<version>.dirty``, never under the series' own version.

torch ranges from the minor of the pinned torch_xla (requirements/runtime.txt) to the end of the range torch-tpu takes
(requirements/torchtpu.txt). Each TPU extra pins torch for its runtime, and the two never meet: ``xla`` adds torch_xla
and ``tpu`` torch_xla with the TPU runtime (libtpu) for a Cloud TPU VM, both with torch of torch_xla's minor (torch_xla
declares no dependency on torch and breaks with any other minor); ``torchtpu`` adds torch-tpu and libtpu with torch
2.11 or newer. ``python_requires`` is the range of Pythons that have wheels of torch and torch_xla, stated in
runtime.txt; torch-tpu itself needs Python 3.11 or newer.
"""
import os
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
# the fork's tools are a package of the standard library only (tools/forkq), importable inside pip's isolated build
sys.path.insert(0, str(ROOT / "tools"))
from forkq import tree, upstream  # noqa: E402

if (ROOT / "patches" / "1.8.6" / "series").exists():
    # a checkout: make sure src/ holds exactly the pinned upstream plus the whole series
    tree.materialize(ROOT / "src", upto=None, quiet=True)
VERSION = tree.settle_version(ROOT / "src")
TORCH = upstream.torch_requirements(ROOT / "requirements" / "runtime.txt", ROOT / "requirements" / "torchtpu.txt")
PYTHON = upstream.python_range(ROOT / "requirements" / "runtime.txt")

setup(
    name=os.environ.get("FORK_DIST_NAME", "pytorch-lightning"),
    version=VERSION,
    description="PyTorch Lightning 1.8.6 with the Lightning XLA fork's patch queue for Cloud TPUs (PJRT, torch_xla 2.x)",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=PYTHON.specifier,
    package_dir={"": "src"},
    packages=find_packages("src", include=["pytorch_lightning", "pytorch_lightning.*", "lightning_lite",
                                           "lightning_lite.*"]),
    package_data={"pytorch_lightning": ["py.typed", "*.md"],
                  "lightning_lite": ["py.typed", "*.md"]},
    include_package_data=False,
    install_requires=[
        "numpy>=1.17.2",
        *TORCH["install_requires"],
        "tqdm>=4.57.0",
        "PyYAML>=5.4",
        "fsspec[http]>2021.06.0",
        "tensorboardX>=2.2",
        "torchmetrics>=0.7.0",
        "packaging>=17.0",
        "typing-extensions>=4.0.0",
        "lightning-utilities>=0.3.0,!=0.4.0",
    ],
    extras_require={"xla": TORCH["xla"], "tpu": TORCH["tpu"], "torchtpu": TORCH["torchtpu"]},
    zip_safe=False,
)
