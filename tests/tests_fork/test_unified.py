"""The three distributions carry the series: pytorch-lightning, lightning-lite and the unified lightning
(``lightning.pytorch`` / ``lightning.lite`` generated from the patched ``src/`` by ``forkq.unified``)."""
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import forkq.tree
import forkq.upstream
from forkq import common, seriesfile, unified
from tests_fork.synthetic import append, combine, make_queue, materialize, remove, touched_files


TPU_PRECISION = ("src/pytorch_lightning/plugins/precision/tpu.py", "src/lightning_lite/plugins/precision/tpu.py")
PL_MARKER = 'SYNTHETIC_FORK_MARKER = "pytorch_lightning:patched"\n'
LITE_MARKER = 'SYNTHETIC_FORK_MARKER = "lightning_lite:patched"\n'
DELETED = "src/pytorch_lightning/README.md"

# imports the unified package from a directory without running lightning/__init__.py, which imports
# lightning.app and so needs the app's own dependencies (not installed in the test environment)
IMPORT_UNIFIED = """
import importlib.util, json, sys, types
root = sys.argv[1]
if importlib.util.find_spec("lightning_cloud") is None:
    pkg = types.ModuleType("lightning"); pkg.__path__ = [root + "/lightning"]; sys.modules["lightning"] = pkg
else:
    sys.path.insert(0, root)
import lightning.pytorch, lightning.lite
import lightning.pytorch.plugins.precision.tpu as pl_tpu, lightning.lite.plugins.precision.tpu as lite_tpu
print(json.dumps({"version": lightning.pytorch.__version__, "lite_version": lightning.lite.__version__,
                  "pl_file": pl_tpu.__file__, "lite_file": lite_tpu.__file__,
                  "pl_marker": getattr(pl_tpu, "SYNTHETIC_FORK_MARKER", None),
                  "lite_marker": getattr(lite_tpu, "SYNTHETIC_FORK_MARKER", None),
                  "standalone_loaded": sorted(m for m in sys.modules
                                              if m.split(".")[0] in ("pytorch_lightning", "lightning_lite"))}))
"""


def _unified_path(src_path: str) -> str:
    """``src/pytorch_lightning/x.py`` -> ``lightning/pytorch/x.py``."""
    pkg, rel = src_path[len("src/"):].split("/", 1)
    return f"{unified.UNIFIED_DIRS[pkg]}/{rel}"


def _run_json(code: str, *args: str, env=None) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """A one-patch queue: marks both TPU precision plugins and deletes a file; materialized."""
    root = make_queue(tmp_path_factory.mktemp("queue"), [{
        "name": "0001-synthetic-fix.patch", "subject": "Synthetic fix", "kind": "fix",
        "edit": combine(append(TPU_PRECISION[0], PL_MARKER), append(TPU_PRECISION[1], LITE_MARKER), remove(DELETED)),
    }])
    materialize(root)
    return root


def test_substitution_reproduces_upstreams_unified_wheel():
    """Upstream's lightning 1.8.6 wheel is the substitution applied to upstream pytorch-lightning 1.8.6's trees."""
    result = unified.compare_upstream()
    assert result["differ"] == []
    assert result["only_upstream"] == []
    # the standalone package ships a py.typed marker that the unified one lacks; we keep it
    assert result["only_generated"] == ["lightning/pytorch/py.typed"]
    assert len(result["equal"]) > 290
    assert "lightning/pytorch/plugins/precision/tpu.py" in result["equal"]
    assert "lightning/lite/plugins/precision/tpu.py" in result["equal"]


def test_substitute_maps_every_standalone_name():
    text = b"import pytorch_lightning as pl\nfrom lightning_lite.x import y\n_module_available('lightning_app')\n"
    assert unified.substitute(text) == (b"import lightning.pytorch as pl\nfrom lightning.lite.x import y\n"
                                        b"_module_available('lightning.app')\n")


def _check_unified_tree(src: Path, tree: Path, touched) -> None:
    lock = forkq.upstream.read_lock()
    for path in touched:
        fork_file = src.parent / path
        target = tree.parent / _unified_path(path)
        if fork_file.exists():
            assert target.read_bytes() == unified.substitute(fork_file.read_bytes()), path
        else:
            assert not target.exists(), f"{path} was deleted by the series but is in the unified tree"
    for path in TPU_PRECISION:  # the xm.optimizer_step call sites
        target = tree.parent / _unified_path(path)
        assert target.read_bytes() == unified.substitute((src.parent / path).read_bytes())
    # file for file: the generated subpackages are exactly the substituted fork packages
    for pkg, sub in unified.UNIFIED_DIRS.items():
        fork_files = unified.tree_files(src / pkg)
        generated = unified.tree_files(tree.parent / sub)
        assert set(fork_files) == set(generated), pkg
    # the rest of lightning is upstream's, unchanged, except the version
    with zipfile.ZipFile(unified.unified_wheel(lock)) as zf:
        for name in zf.namelist():
            if name.startswith("lightning/") and not name.startswith(("lightning/pytorch/", "lightning/lite/")):
                if name.endswith("/"):
                    continue
                if name == "lightning/__version__.py":
                    assert (tree / "__version__.py").read_text() == f'version = "{unified.src_version(src)}"\n'
                else:
                    assert (tree.parent / name).read_bytes() == zf.read(name), name


def test_unified_tree_carries_the_real_series(tmp_path):
    """Whatever the series holds today: every file it touches is in lightning.pytorch / lightning.lite, substituted."""
    src = forkq.tree.materialize(tmp_path / "fork" / "src", quiet=True)
    series = seriesfile.read_series()
    touched = touched_files([(common.PATCH_DIR / n).read_text() for n in series])
    tree = unified.build_tree(src, tmp_path / "unified")
    _check_unified_tree(src, tree, touched)


def test_synthetic_patch_shows_up_in_lightning_pytorch(synthetic, tmp_path):
    src = synthetic / "src"
    patches = [(synthetic / "patches" / "0001-synthetic-fix.patch").read_text()]
    touched = touched_files(patches)
    assert set(touched) == {*TPU_PRECISION, DELETED}
    tree = unified.build_tree(src, tmp_path / "unified")
    _check_unified_tree(src, tree, touched)
    pl_tpu = (tree / "pytorch" / "plugins" / "precision" / "tpu.py").read_text()
    assert pl_tpu.endswith('SYNTHETIC_FORK_MARKER = "lightning.pytorch:patched"\n')
    assert not (tree / "pytorch" / "README.md").exists()
    got = _run_json(IMPORT_UNIFIED, str(tmp_path / "unified"))
    assert got["pl_marker"] == "lightning.pytorch:patched" and got["lite_marker"] == "lightning.lite:patched"
    assert got["pl_file"] == str(tree / "pytorch" / "plugins" / "precision" / "tpu.py")
    assert got["version"] == got["lite_version"] == unified.src_version(src)
    assert got["standalone_loaded"] == []


def test_lightning_metadata_is_upstreams_with_a_working_app_stack():
    lock = forkq.upstream.read_lock()
    with zipfile.ZipFile(unified.unified_wheel(lock)) as zf:
        upstream = zf.read("lightning-1.8.6.dist-info/METADATA").decode()
    meta = unified.lightning_metadata(upstream, "1.8.6+xla.3.gdeadbeef")
    head = meta.split("\n\n", 1)[0].splitlines()
    requires = [line.split(": ", 1)[1] for line in head if line.startswith("Requires-Dist: ")]
    assert "Version: 1.8.6+xla.3.gdeadbeef" in head
    base = [r for r in requires if "extra ==" not in r]
    assert "lightning-cloud>=0.5.12,<0.6" in base and "pydantic<2" in base and "websockets" in base
    torch = forkq.upstream.torch_requirements()
    assert torch["install_requires"][0] in base and "torchmetrics>=0.7.0" in base
    assert not [r for r in requires if r.startswith("torch>=1.9")]
    assert f"{torch['xla'][1]} ; extra == 'xla'" in requires and f"{torch['tpu'][1]} ; extra == 'tpu'" in requires
    # every upstream extra is still offered
    upstream_extras = set(re.findall(r"^Provides-Extra: (\S+)$", upstream, flags=re.M))
    assert upstream_extras and upstream_extras | {"xla", "tpu", "torchtpu"} == set(re.findall(r"^Provides-Extra: (\S+)$", meta,
                                                                                    flags=re.M))


def _wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


@pytest.fixture(scope="module")
def synthetic_wheels(synthetic, tmp_path_factory):
    dist = tmp_path_factory.mktemp("dist")
    src = synthetic / "src"
    return {
        "pytorch_lightning": unified.build_pytorch_lightning_wheel(src, dist),
        "lightning_lite": unified.build_lite_wheel(src, dist),
        "lightning": unified.build_unified_wheel(src, dist),
    }


@pytest.mark.slow
def test_three_wheels_install_into_a_target_and_carry_the_patch(synthetic, synthetic_wheels, tmp_path):
    version = unified.src_version(synthetic / "src")
    assert {_wheel_version(w) for w in synthetic_wheels.values()} == {version}
    target = tmp_path / "target"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                           "--disable-pip-version-check", "--target", str(target),
                           *map(str, synthetic_wheels.values())], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    env = dict(os.environ, PYTHONPATH=str(target))
    got = _run_json(
        "import json, pytorch_lightning, lightning_lite\n"
        "import pytorch_lightning.plugins.precision.tpu as a, lightning_lite.plugins.precision.tpu as b\n"
        "print(json.dumps([pytorch_lightning.__version__, lightning_lite.__version__, a.__file__, "
        "a.SYNTHETIC_FORK_MARKER, b.SYNTHETIC_FORK_MARKER]))", env=env)
    assert got == [version, version, str(target / "pytorch_lightning/plugins/precision/tpu.py"),
                   "pytorch_lightning:patched", "lightning_lite:patched"]
    got = _run_json(IMPORT_UNIFIED, str(target), env=env)
    assert (got["pl_marker"], got["lite_marker"]) == ("lightning.pytorch:patched", "lightning.lite:patched")
    assert got["pl_file"] == str(target / "lightning/pytorch/plugins/precision/tpu.py")
    assert got["version"] == version and got["standalone_loaded"] == []
    assert (target / "lightning/app/__init__.py").is_file()
    assert not (target / "pytorch_lightning/README.md").exists()
    assert not (target / "lightning/pytorch/README.md").exists()


def _record(site: Path, info_dir: str):
    return [line.split(",")[0] for line in (site / info_dir / "RECORD").read_text().splitlines() if line]


@pytest.mark.slow
def test_fork_wheel_replaces_an_upstream_install_cleanly(synthetic, synthetic_wheels, tmp_path):
    """pip install pytorch-lightning==1.8.6 from upstream, then the fork's wheel over it: no stale file or metadata."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = Path(subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    pip = [sys.executable, "-m", "pip", "--python", str(vpy), "install", "--no-deps", "--no-index", "-q",
           "--disable-pip-version-check"]
    # pip must see the new venv only: a PYTHONPATH (e.g. to a src/ with an egg-info) would look installed to it
    pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    upstream = forkq.upstream.fetch_wheel("pytorch-lightning", forkq.upstream.read_lock()["pytorch-lightning"])
    subprocess.run([*pip, str(upstream)], check=True, capture_output=True, env=pip_env)
    assert (site / "pytorch_lightning/README.md").is_file()
    assert (site / "pytorch_lightning-1.8.6.dist-info").is_dir()

    wheel = synthetic_wheels["pytorch_lightning"]
    proc = subprocess.run([*pip, str(wheel)], capture_output=True, text=True, env=pip_env)
    assert proc.returncode == 0, proc.stderr
    version = unified.src_version(synthetic / "src")
    infos = sorted(p.name for p in site.glob("pytorch_lightning-*.dist-info"))
    assert infos == [f"pytorch_lightning-{version}.dist-info"], "upstream's metadata was left behind"
    record = set(_record(site, infos[0]))
    on_disk = {p.relative_to(site).as_posix() for pkg in ("pytorch_lightning", "lightning_lite")
               for p in (site / pkg).rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert on_disk - record == set(), "files not owned by the installed wheel (stale upstream files)"
    assert not (site / "pytorch_lightning/README.md").exists()
    with zipfile.ZipFile(wheel) as zf:
        for name in ("pytorch_lightning/plugins/precision/tpu.py", "lightning_lite/plugins/precision/tpu.py"):
            assert (site / name).read_bytes() == zf.read(name)
    # and the interpreter resolves the fork's distribution and code from there
    env = dict(os.environ, PYTHONPATH=str(site))
    got = _run_json("import json, importlib.metadata as md, pytorch_lightning.plugins.precision.tpu as t\n"
                    "print(json.dumps([md.version('pytorch-lightning'), t.SYNTHETIC_FORK_MARKER, t.__file__]))",
                    env=env)
    assert got == [version, "pytorch_lightning:patched", str(site / "pytorch_lightning/plugins/precision/tpu.py")]
