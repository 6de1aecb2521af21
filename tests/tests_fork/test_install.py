"""Installing the fork cannot pair torch and torch_xla wrongly, the README shows the TPU VM command and the tool's own
version, and `python -m build` works (its sdist carries the recipe: lock, patches, tool).

The resolver tests ask pip itself (``--dry-run --report``) what it would install, offline, from small stand-in
wheels of torch, torch_xla and the fork's other dependencies: the stand-ins carry only metadata, which is all a
resolution reads. Like the real torch_xla, the stand-in declares no dependency on torch.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import forkq.tree
import forkq.upstream
from forkq import authoring, common, seriesfile, tree, unified
from tests_fork.upstream_queue import (  # noqa: F401 (fixtures)
    format_patch, materialize_queue, queue, REPO, upstream_about)


# read here, not through the tool under test
PINS = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (REPO / "requirements" / "runtime.txt").read_text(), flags=re.M))
XLA = PINS["torch_xla"]
MAJOR, MINOR = (int(x) for x in XLA.split(".")[:2])
TORCH_SAME_MINOR = f"{MAJOR}.{MINOR}.0"
TORCH_NEXT_MINOR = f"{MAJOR}.{MINOR + 1}.0"
TORCH_OLDER_MINOR = f"{MAJOR}.{MINOR - 1}.0"
TPU_PINS = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (REPO / "requirements" / "torchtpu.txt").read_text(),
                           flags=re.M))
TORCH_OF_TORCH_TPU = TPU_PINS["torch"]
TORCH_TPU_LOW, TORCH_TPU_HIGH = re.search(r"^# torch-range: >=(\S+),<(\S+)$",
                                          (REPO / "requirements" / "torchtpu.txt").read_text(), flags=re.M).groups()
TORCH_PAST_TORCH_TPU = f"{TORCH_TPU_HIGH}.0"


# --------------------------------------------------------------------------------------------- the README
def test_the_readme_version_example_is_the_tools_version():
    text = (REPO / "README.md").read_text()
    block = text[text.index(authoring.README_BEGIN):text.index(authoring.README_END)]
    assert authoring.readme_version_block(tree.fork_version()) in block, (
        "README.md's version example is stale: run `python3 tools/fork.py readme`")
    assert authoring.sync_readme(check_only=True)


def test_the_readme_counts_and_the_table_of_patches_are_the_tools():
    text = (REPO / "README.md").read_text()
    assert authoring.has_changes_block(text), authoring.missing_changes_block(REPO / "README.md")
    assert authoring.readme_with_changes(text) == text, (
        "README.md's count of the changes is stale: run `python3 tools/fork.py readme`")
    page = authoring.patches_page().read_text()
    assert authoring.page_with_patches(page) == page, "docs/patches.md is stale: run `python3 tools/fork.py readme`"
    assert len(re.findall(r"^\| \d{4} \|", page, flags=re.M)) == len(seriesfile.read_series())


README_MAX_LINES = 160


def _readme_table(text: str, heading: str) -> list:
    """The rows of the table under ``## heading`` as lists of cells (the header and its rule left out)."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def test_the_readme_is_a_front_door():
    """At most README_MAX_LINES lines; the map of the folders names every folder the repository tracks and only
    those; each job's command is a target of the Makefile; the test command is the one CI runs."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md is the front door: move details into docs/"
    assert not re.search(r"\bshort\b[^.]*\bqueue\b", text)
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True,
                                 timeout=60).stdout.split())
    top = {path.split("/", 1)[0] for path in tracked if "/" in path}
    mapped = [name.strip("`").rstrip("/") for row in _readme_table(text, "Where things are")
              for name in row[0].split(", ")]
    for name in mapped:
        assert (REPO / name).exists(), f"README.md's map names {name}, which is not in the repository"
    assert top - {"patches"} <= {name.split("/", 1)[0] for name in mapped}, "a folder the map leaves out"
    assert {f"patches/{p.name}" for p in (REPO / "patches").iterdir() if p.is_dir()} <= set(mapped)
    targets = set(re.findall(r"^([a-z][\w.-]*):(?!=)", (REPO / "Makefile").read_text(), flags=re.M))
    for job, command in _readme_table(text, "One command for each job"):
        for target in re.findall(r"`make ([\w.-]+)", command):
            assert target in targets, f"{job}: `make {target}` is no target of the Makefile"
    # the README's test command is exactly what CI runs
    assert "\nmake test   # " in text
    assert "make test" in (REPO / ".ci" / "run").read_text().splitlines()


def test_the_readme_tool_rewrites_a_stale_example_and_check_refuses_it(tmp_path):
    readme = tmp_path / "README.md"
    # only the version block goes stale: other generated blocks (the bench figures) quote the version they measured
    text = (REPO / "README.md").read_text()
    start, end = text.index("<!-- version:begin"), text.index("<!-- version:end -->")
    readme.write_text(text[:start] + text[start:end].replace(tree.fork_version(), "1.8.6+xla.9.g68233b26") + text[end:])
    assert not authoring.sync_readme(readme, check_only=True)
    assert "1.8.6+xla.9.g68233b26" in readme.read_text()  # --check writes nothing
    assert not authoring.sync_readme(readme)
    assert authoring.sync_readme(readme, check_only=True)
    assert readme.read_text() == (REPO / "README.md").read_text()
    with pytest.raises(common.ForkError, match="no version block"):
        authoring.readme_with_version("# no block here\n", "1.0")


def test_the_readme_installs_the_tpu_extra_on_a_tpu_vm():
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Install\n"):text.index("Using it on a TPU VM:")]
    commands = re.findall(r"^pip install .*$", section, flags=re.M)
    assert commands, section
    requirement = Requirement(commands[0].split("pip install ", 1)[1].strip().strip('"'))
    assert requirement.name == "pytorch-lightning" and requirement.extras == {"tpu"} and requirement.url
    assert f"torch_xla[tpu]=={XLA}" in forkq.upstream.torch_requirements()["tpu"]
    # no bare torch / torch_xla install of a hand-picked pair left in the section
    assert "pip install \"torch==" not in section


# --------------------------------------------------------------------------------------------- the pins
def test_each_tpu_extra_pins_the_torch_of_its_runtime():
    reqs = forkq.upstream.torch_requirements()
    xla_torch = Requirement(reqs["xla"][0])
    assert xla_torch.name == "torch"
    assert xla_torch.specifier.contains(TORCH_SAME_MINOR) and xla_torch.specifier.contains(f"{MAJOR}.{MINOR}.1")
    assert not xla_torch.specifier.contains(TORCH_NEXT_MINOR) and not xla_torch.specifier.contains(TORCH_OLDER_MINOR)
    assert Version(PINS["torch"]) in xla_torch.specifier
    assert reqs["xla"] == [reqs["tpu"][0], f"torch_xla=={XLA}"]
    assert reqs["tpu"][1:] == [f"torch_xla[tpu]=={XLA}"]
    tpu_torch = Requirement(reqs["torchtpu"][0])
    assert tpu_torch.name == "torch" and Version(TORCH_OF_TORCH_TPU) in tpu_torch.specifier
    assert tpu_torch.specifier.contains(f"{TORCH_TPU_LOW}.0") and not tpu_torch.specifier.contains(TORCH_PAST_TORCH_TPU)
    assert {Requirement(r).name for r in reqs["torchtpu"]} == {"torch", "torch-tpu", "libtpu"}
    # the two runtimes' torches never meet, so pip refuses `[tpu,torchtpu]` (resolved for real below)
    candidates = [f"{MAJOR}.{m}.{p}" for m in range(MINOR - 1, MINOR + 10) for p in range(3)]
    assert not [v for v in candidates if xla_torch.specifier.contains(v) and tpu_torch.specifier.contains(v)]
    # without an extra: anything from torch_xla's torch to the end of torch-tpu's range
    base = Requirement(reqs["install_requires"][0])
    assert base.specifier.contains(TORCH_SAME_MINOR) and base.specifier.contains(TORCH_OF_TORCH_TPU)
    assert not base.specifier.contains(TORCH_OLDER_MINOR) and not base.specifier.contains(TORCH_PAST_TORCH_TPU)


def test_runtime_pins_of_different_minors_are_refused(tmp_path):
    bad = tmp_path / "runtime.txt"
    bad.write_text("torch==2.10.0\ntorch_xla==2.9.0\n")
    with pytest.raises(common.ForkError, match="must share a minor version"):
        forkq.upstream.torch_requirements(bad)
    bad.write_text("torch==2.9.0\n")
    with pytest.raises(common.ForkError, match="must pin torch_xla"):
        forkq.upstream.torch_requirements(bad)


@pytest.mark.parametrize(("text", "message"), [
    ("torch==2.14.1\ntorch-tpu==0.2.0\nlibtpu==0.0.52\n", "must state the torch range"),
    ("torch==2.14.1\ntorch-tpu==0.2.0\n# torch-range: >=2.11,<2.16\n", "must pin libtpu"),
    ("torch==2.9.0\ntorch-tpu==0.2.0\nlibtpu==0.0.52\n# torch-range: >=2.9,<2.16\n", "must start after"),
    ("torch==2.16.0\ntorch-tpu==0.2.0\nlibtpu==0.0.52\n# torch-range: >=2.11,<2.16\n", "outside the range"),
])
def test_torchtpu_pins_that_could_pair_wrongly_are_refused(tmp_path, text, message):
    bad = tmp_path / "torchtpu.txt"
    bad.write_text(text)
    with pytest.raises(common.ForkError, match=message):
        forkq.upstream.torch_requirements(torchtpu=bad)


def _requires(metadata: str):
    head = metadata.split("\n\n", 1)[0]
    return [line.split(": ", 1)[1] for line in head.splitlines() if line.startswith("Requires-Dist: ")]


def test_every_distribution_carries_the_pin_and_both_extras():
    torch = forkq.upstream.torch_requirements()["install_requires"][0]
    lite = _requires(unified.lite_metadata("1.8.6+xla.1.gdeadbeef"))
    with zipfile.ZipFile(unified.unified_wheel()) as zf:
        upstream = zf.read("lightning-1.8.6.dist-info/METADATA").decode()
    lightning = _requires(unified.lightning_metadata(upstream, "1.8.6+xla.1.gdeadbeef"))
    for requires in (lite, lightning):
        assert torch in requires and not any(r.startswith("torch>=1.9") for r in requires), requires
        assert f"torch_xla=={XLA} ; extra == 'xla'" in requires
        assert f"torch_xla[tpu]=={XLA} ; extra == 'tpu'" in requires
        assert f"{forkq.upstream.torch_requirements()['tpu'][0]} ; extra == 'tpu'" in requires
        for requirement in forkq.upstream.torch_requirements()["torchtpu"]:
            assert f"{requirement} ; extra == 'torchtpu'" in requires


# --------------------------------------------------------------------------------------------- pip's resolution
STAND_INS = [
    ("numpy", "2.0.0", [], {}), ("tqdm", "4.67.1", [], {}), ("PyYAML", "6.0", [], {}),
    ("fsspec", "2025.9.0", [], {"http": []}), ("tensorboardX", "2.6", [], {}), ("torchmetrics", "1.9.0", [], {}),
    ("packaging", "25.0", [], {}), ("typing-extensions", "4.15.0", [], {}),
    ("lightning-utilities", "0.15.3", [], {}),
    ("torch", TORCH_OLDER_MINOR, [], {}), ("torch", TORCH_SAME_MINOR, [], {}), ("torch", TORCH_NEXT_MINOR, [], {}),
    # like the real one: no dependency on torch
    ("torch_xla", XLA, [], {"tpu": ["libtpu==0.0.21"]}), ("libtpu", "0.0.21", [], {}),
    # the TorchTPU stack, and a torch past torch-tpu's range
    ("torch", TORCH_OF_TORCH_TPU, [], {}), ("torch", TORCH_PAST_TORCH_TPU, [], {}),
    ("torch_tpu", TPU_PINS["torch-tpu"], [f"torch>={TORCH_TPU_LOW}.0,<={TORCH_TPU_HIGH}.0", "libtpu>=0.0.50"], {}),
    ("libtpu", TPU_PINS["libtpu"], [], {}),
]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    links = tmp_path_factory.mktemp("links")
    for name, version, requires, extras in STAND_INS:
        norm = re.sub(r"[-_.]+", "_", name).lower()
        meta = unified._metadata(name, version, "stand-in for a resolver test", requires, extras, "stand-in")
        unified.write_wheel(links, name, version, {f"{norm}_standin/__init__.py": b""}, meta)
    return links


@pytest.fixture(scope="module")
def fork_wheels(tmp_path_factory, upstream_about):
    """The fork's pytorch-lightning (setup.py) and lightning-lite wheels, built from a small materialized queue."""
    root = tmp_path_factory.mktemp("q")
    (root / "patches").mkdir()
    (root / "patches" / "0001-x.patch").write_text(format_patch("x", upstream_about, upstream_about + "X = 1\n"))
    (root / "patches" / "series").write_text("0001-x.patch\n")
    (root / "upstream.lock").write_text(common.LOCK_FILE.read_text())
    src = materialize_queue(root)
    dist = tmp_path_factory.mktemp("dist")
    return {"pytorch-lightning": unified.build_pytorch_lightning_wheel(src, dist),
            "lightning-lite": unified.build_lite_wheel(src, dist)}


def _pip_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def _resolve(links: Path, *requirements: str, python: str = None) -> dict:
    """``{name: version}`` that pip would install for ``requirements`` (a dry run, offline, from ``links``)."""
    cmd = [sys.executable, "-m", "pip"]
    cmd += ["--python", python] if python else []
    cmd += ["install", "--dry-run", "--no-index", "--find-links", str(links), "--quiet", "--report", "-"]
    cmd += [] if python else ["--ignore-installed"]
    proc = subprocess.run([*cmd, *requirements], capture_output=True, text=True, env=_pip_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    return {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
            for item in report["install"]}


@pytest.mark.slow
@pytest.mark.parametrize("dist", ["pytorch-lightning", "lightning-lite"])
def test_each_tpu_extra_installs_the_torch_of_its_runtime(stand_ins, fork_wheels, dist):
    wheel = str(fork_wheels[dist])
    # alone: the newest torch of the fork's range, not one past torch-tpu's
    got = _resolve(stand_ins, wheel)
    assert got["torch"] == TORCH_OF_TORCH_TPU and "torch-xla" not in got and "torch-tpu" not in got
    # the tpu extra: the matched pair and libtpu
    got = _resolve(stand_ins, f"{dist}[tpu] @ file://{wheel}")
    assert (got["torch"], got["torch-xla"], got["libtpu"]) == (TORCH_SAME_MINOR, XLA, "0.0.21")
    got = _resolve(stand_ins, f"{dist}[xla] @ file://{wheel}")
    assert (got["torch"], got["torch-xla"]) == (TORCH_SAME_MINOR, XLA) and "libtpu" not in got
    # the torchtpu extra: torch-tpu with a torch it takes, never torch_xla
    got = _resolve(stand_ins, f"{dist}[torchtpu] @ file://{wheel}")
    assert (got["torch"], got["torch-tpu"], got["libtpu"]) == (TORCH_OF_TORCH_TPU, TPU_PINS["torch-tpu"],
                                                               TPU_PINS["libtpu"])
    assert "torch-xla" not in got
    # both: no torch serves both runtimes, and pip says so instead of installing a pair that cannot work
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--find-links",
                           str(stand_ins), "--quiet", "--ignore-installed", f"{dist}[tpu,torchtpu] @ file://{wheel}"],
                          capture_output=True, text=True, env=_pip_env(), timeout=300)
    assert proc.returncode != 0 and "ResolutionImpossible" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_installing_the_fork_into_an_environment_with_the_wrong_torch_repairs_the_pair(stand_ins, fork_wheels,
                                                                                         tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    # torch_xla and then a torch of another minor: the broken pair that `pip check` does not see
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--quiet",
                           "--find-links", str(stand_ins), f"torch_xla=={XLA}", f"torch=={TORCH_NEXT_MINOR}"],
                          capture_output=True, text=True, env=_pip_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    # the fork alone takes any torch of its range, so the pair stays as it is: the tpu extra is what repairs it
    wheel = fork_wheels["pytorch-lightning"]
    got = _resolve(stand_ins, f"pytorch-lightning[tpu] @ file://{wheel}", python=python)
    assert got["torch"] == TORCH_SAME_MINOR  # pip replaces the wrong torch


# --------------------------------------------------------------------------------------------- sdist
RECIPE = ["setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "upstream.lock", "tools/fork.py",
          "tools/check_python.py", "requirements/runtime.txt", "requirements/torchtpu.txt",
          *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tools" / "forkq").rglob("*.py"))]


@pytest.mark.slow
def test_the_sdist_carries_the_recipe_and_builds_the_wheel(tmp_path):
    """What `python -m build` does: an sdist from a checkout, then a wheel from the unpacked sdist (here without
    build isolation and with the pinned wheel in the cache, so nothing is downloaded)."""
    checkout = tmp_path / "checkout"
    for rel in [*RECIPE, *[f"patches/1.8.6/{n}" for n in ["series", *seriesfile.read_series()]]]:
        if not (REPO / rel).exists():
            continue  # what the sdist lacks then is checked below
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, checkout / rel)
    entry = forkq.upstream.read_lock()["pytorch-lightning"]
    wheel = forkq.upstream.fetch_wheel("pytorch-lightning", entry)

    def seed_cache(root: Path) -> None:
        (root / ".cache" / "upstream").mkdir(parents=True)
        shutil.copy2(wheel, root / ".cache" / "upstream" / entry["filename"])

    seed_cache(checkout)
    out = tmp_path / "sdist"
    proc = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))"],
                          cwd=checkout, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sdist = out / proc.stdout.strip().splitlines()[-1]
    version = tree.fork_version()
    assert sdist.name == f"pytorch_lightning-{version}.tar.gz"
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
        tf.extractall(tmp_path / "unpacked")
    for rel in [*RECIPE, "patches/1.8.6/series", *[f"patches/1.8.6/{n}" for n in seriesfile.read_series()]]:
        assert rel in names, rel
    assert not [n for n in names if n.startswith(("src/pytorch_lightning/", "src/lightning_lite/"))], \
        "upstream source in the sdist"
    unpacked = tmp_path / "unpacked" / sdist.name[: -len(".tar.gz")]
    seed_cache(unpacked)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "wheels"), str(unpacked)], capture_output=True, text=True,
                          env=_pip_env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (built,) = (tmp_path / "wheels").glob("*.whl")
    assert built.name == f"pytorch_lightning-{version}-py3-none-any.whl"
    with zipfile.ZipFile(built) as zf:
        assert "pytorch_lightning/trainer/trainer.py" in zf.namelist()
        assert zf.read("pytorch_lightning/__version__.py").decode() == f'version = "{version}"\n'
        meta = zf.read(f"pytorch_lightning-{version}.dist-info/METADATA").decode()
    requires = [Requirement(r) for r in _requires(meta)]
    pinned = Requirement(forkq.upstream.torch_requirements()["install_requires"][0])
    assert [r.specifier for r in requires if r.name == "torch" and not r.marker] == [pinned.specifier]
    assert "Provides-Extra: tpu" in meta
    assert f"Requires-Python: {forkq.upstream.python_range().specifier}" in meta.splitlines()
    assert any(r.name == "torch_xla" and r.extras == {"tpu"} and str(r.marker) == 'extra == "tpu"' for r in requires)


# --------------------------------------------------------------------------------------------- dirty trees
@pytest.mark.slow
def test_wheels_of_an_edited_tree_are_marked_dirty(queue, tmp_path):
    src = materialize_queue(queue)
    canonical = tree.read_stamp(src)["version"]
    about = src / "pytorch_lightning" / "__about__.py"
    about.write_text(about.read_text() + "LOCAL_EDIT = 1\n")
    dist = tmp_path / "dist"
    lite = unified.build_lite_wheel(src, dist)
    pl = unified.build_pytorch_lightning_wheel(src, dist)
    for wheel in (lite, pl):
        assert wheel.name.split("-")[1] == f"{canonical}.dirty", wheel.name
    with zipfile.ZipFile(pl) as zf:
        assert zf.read("pytorch_lightning/__version__.py").decode() == f'version = "{canonical}.dirty"\n'


def test_the_tpu_vm_requirements_pin_the_same_torch_xla():
    text = (REPO / "requirements" / "tpu.txt").read_text()
    assert re.search(rf"^torch_xla\[tpu\]=={re.escape(XLA)}$", text, flags=re.M), text


def test_the_accelerator_states_the_torch_range_of_requirements_torchtpu():
    """The TorchTPU accelerator's refusal names torch-tpu's torch range; requirements/torchtpu.txt states it for pip:
    the two say the same."""
    from lightning_lite.accelerators.torch_tpu import _TORCH_TPU_TORCH_RANGE

    (low_major, low_minor), (high_major, high_minor) = _TORCH_TPU_TORCH_RANGE
    assert f"{low_major}.{low_minor}" == TORCH_TPU_LOW
    # the accelerator names the last minor it takes, the requirements the first it does not
    assert f"{high_major}.{high_minor + 1}" == TORCH_TPU_HIGH
