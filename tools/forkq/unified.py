"""The fork in the three forms upstream publishes 1.8.6: ``pytorch-lightning``, ``lightning-lite`` and ``lightning``.

Upstream's unified ``lightning`` 1.8.6 wheel carries ``lightning/pytorch`` and ``lightning/lite``, which are the
trees of ``pytorch_lightning`` and ``lightning_lite`` with three names substituted in every file
(``pytorch_lightning`` -> ``lightning.pytorch``, ``lightning_lite`` -> ``lightning.lite``,
``lightning_app`` -> ``lightning.app``); ``compare-upstream`` checks that on the pinned wheels. This tool builds:

* ``lightning_lite-<ver>``: the ``lightning_lite`` package of the materialized ``src/``;
* ``lightning-<ver>``: ``lightning/pytorch`` and ``lightning/lite`` generated from the materialized ``src/`` by the
  substitution, everything else of ``lightning`` (``lightning/app``, the top-level modules) unchanged from the pinned
  upstream ``lightning==1.8.6`` wheel (hash-checked through ``upstream.lock``).

``pytorch_lightning-<ver>`` is the ``setup.py`` build (``make dist``). All three carry the fork's version.

Commands (``python3 tools/fork.py unified ...``)::

    wheels [--src SRC] [--dist DIR]     build the lightning-lite and lightning wheels
    tree --dest DIR [--src SRC]         write the unified ``lightning`` package to DIR/lightning
    compare-upstream                    substitution on upstream's trees == upstream's unified wheel?
"""
import base64
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import common
from .common import ForkError
from .tree import STAMP_NAME, settle_version
from .upstream import fetch_wheel, read_lock, torch_requirements

SUBSTITUTIONS: Tuple[Tuple[bytes, bytes], ...] = (
    (b"pytorch_lightning", b"lightning.pytorch"),
    (b"lightning_lite", b"lightning.lite"),
    (b"lightning_app", b"lightning.app"),
)
# standalone package -> its place inside the unified package
UNIFIED_DIRS = {"pytorch_lightning": "lightning/pytorch", "lightning_lite": "lightning/lite"}
UNIFIED_DIST = "lightning"
WHEEL_DATE = (1980, 1, 1, 0, 0, 0)  # reproducible archives

# Upstream's unified 1.8.6 metadata no longer resolves to an importable set: `import lightning` (and so
# `import lightning.pytorch`) imports lightning.app, which needs pydantic 1 (pydantic.main.ModelMetaclass),
# a lightning-cloud 0.5.x (0.6.0 lacks lightning_cloud.openapi.AppinstancesIdBody) and `websockets`, which the
# wheel does not declare. Measured: with these three changes a fresh resolution imports.
LIGHTNING_REQUIRES_OVERRIDES = {"lightning-cloud": "lightning-cloud>=0.5.12,<0.6"}
LIGHTNING_REQUIRES_EXTRA = ["pydantic<2", "websockets"]
# torch from the torch_xla minor to the end of torch-tpu's range; the `xla` / `tpu` extras pin torch_xla's minor, the
# `torchtpu` extra torch-tpu's range (requirements/runtime.txt, requirements/torchtpu.txt)
TORCH = torch_requirements()
LITE_REQUIRES = [
    "numpy>=1.17.2",
    *TORCH["install_requires"],
    "fsspec[http]>2021.06.0",
    "packaging>=17.0",
    "typing-extensions>=4.0.0",
    "lightning-utilities>=0.3.0,!=0.4.0",
]


# --------------------------------------------------------------------------------------------- the substitution
def substitute(data: bytes) -> bytes:
    for old, new in SUBSTITUTIONS:
        data = data.replace(old, new)
    return data


def tree_files(root: Path) -> Dict[str, Path]:
    """``{relative posix path: path}`` of the files under ``root``, without caches and the fork's stamp."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or "__pycache__" in rel.parts or path.suffix == ".pyc" or path.name == STAMP_NAME:
            continue
        out[rel.as_posix()] = path
    return out


def unified_wheel(lock: Optional[Dict] = None, cache_dir: Optional[Path] = None) -> Path:
    lock = read_lock() if lock is None else lock
    if UNIFIED_DIST not in lock:
        raise ForkError(f"upstream.lock has no {UNIFIED_DIST!r} entry")
    return fetch_wheel(UNIFIED_DIST, lock[UNIFIED_DIST], cache_dir)


def src_version(src: Path) -> str:
    """The version the wheels of ``src`` carry: the series' own, or ``.dirty`` when ``src`` was edited by hand (the
    version files of ``src`` are brought in line first, as they are shipped too)."""
    return settle_version(src)


def unified_files(src: Path, upstream_unified: Path, version: str) -> Dict[str, bytes]:
    """``{archive name: content}`` of the fork's ``lightning`` package."""
    files: Dict[str, bytes] = {}
    replaced = tuple(d + "/" for d in UNIFIED_DIRS.values())
    with zipfile.ZipFile(upstream_unified) as zf:
        for name in zf.namelist():
            if name.endswith("/") or name.split("/", 1)[0] != "lightning" or name.startswith(replaced):
                continue
            files[name] = zf.read(name)
    for pkg, target in UNIFIED_DIRS.items():
        if not (src / pkg).is_dir():
            raise ForkError(f"{src / pkg} is missing")
        for rel, path in tree_files(src / pkg).items():
            files[f"{target}/{rel}"] = substitute(path.read_bytes())
    files["lightning/__version__.py"] = f'version = "{version}"\n'.encode()
    return files


def write_files(files: Dict[str, bytes], dest: Path) -> None:
    for name, data in files.items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def build_tree(src: Path, dest: Path, lock: Optional[Dict] = None, cache_dir: Optional[Path] = None) -> Path:
    """Write the unified ``lightning`` package generated from ``src`` to ``dest/lightning``; return it."""
    files = unified_files(src, unified_wheel(lock, cache_dir), src_version(src))
    if (dest / "lightning").exists():
        shutil.rmtree(dest / "lightning")
    write_files(files, dest)
    return dest / "lightning"


# --------------------------------------------------------------------------------------------- wheels
def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def write_wheel(dist_dir: Path, dist: str, version: str, files: Dict[str, bytes], metadata: str,
                extra_info: Optional[Dict[str, bytes]] = None) -> Path:
    """A pure-Python ``py3-none-any`` wheel holding ``files``, written reproducibly."""
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    info_dir = f"{norm}-{version}.dist-info"
    tops = sorted({name.split("/", 1)[0] for name in files})
    meta = {
        "METADATA": metadata.encode(),
        "WHEEL": b"Wheel-Version: 1.0\nGenerator: lightning-xla-fork tools/fork.py unified\nRoot-Is-Purelib: true\n"
                 b"Tag: py3-none-any\n",
        "top_level.txt": ("\n".join(tops) + "\n").encode(),
        **(extra_info or {}),
    }
    entries = sorted(files.items()) + [(f"{info_dir}/{k}", v) for k, v in sorted(meta.items())]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    record += f"{info_dir}/RECORD,,\n"
    dist_dir.mkdir(parents=True, exist_ok=True)
    wheel = dist_dir / f"{norm}-{version}-py3-none-any.whl"
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries + [(f"{info_dir}/RECORD", record.encode())]:
            info = zipfile.ZipInfo(name, date_time=WHEEL_DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    tmp.replace(wheel)
    return wheel


def _metadata(name: str, version: str, summary: str, requires: Sequence[str], extras: Dict[str, Sequence[str]],
              description: str, header_extra: Sequence[str] = ()) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}",
             "License: Apache-2.0", "Requires-Python: >=3.9", *header_extra]
    lines += [f"Requires-Dist: {r}" for r in requires]
    for extra, reqs in extras.items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {r} ; extra == '{extra}'" for r in reqs]
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + description.strip() + "\n"


def _requirement_name(req: str) -> str:
    return re.split(r"[\s\[(<>=!~;]", req.strip(), 1)[0].lower().replace("_", "-")


def lightning_metadata(upstream_metadata: str, version: str) -> str:
    """The fork's ``lightning`` metadata: upstream's requirements and extras, with the changes that make
    ``import lightning`` work on a fresh install today (see LIGHTNING_REQUIRES_*), torch in the fork's range, and the
    ``xla``, ``tpu`` and ``torchtpu`` extras."""
    head = upstream_metadata.split("\n\n", 1)[0]
    overrides = dict(LIGHTNING_REQUIRES_OVERRIDES, torch=TORCH["install_requires"][0])
    requires: List[str] = []
    extras: Dict[str, List[str]] = {}
    for line in head.splitlines():
        key, _, value = line.partition(": ")
        if key == "Provides-Extra":
            extras.setdefault(value.strip(), [])
        elif key == "Requires-Dist":
            req, _, marker = value.partition(";")
            m = re.fullmatch(r"\s*extra == '([^']+)'\s*", marker)
            # "pkg (>=1,<2)" -> "pkg>=1,<2"
            req = re.sub(r"\s*\((.*)\)\s*$", r"\1", req.strip())
            req = overrides.get(_requirement_name(req), req)
            if m:
                extras.setdefault(m.group(1), []).append(req)
            elif not marker.strip():
                requires.append(req)
            else:
                requires.append(f"{req} ; {marker.strip()}")
    requires += [r for r in LIGHTNING_REQUIRES_EXTRA if _requirement_name(r) not in map(_requirement_name, requires)]
    extras["xla"] = list(TORCH["xla"])
    extras["tpu"] = list(TORCH["tpu"])
    extras["torchtpu"] = list(TORCH["torchtpu"])
    description = (
        "# lightning (Lightning XLA fork)\n\n"
        "The unified `lightning` 1.8.6 package with the Lightning XLA fork's patch queue for Cloud TPUs "
        "(PJRT, torch_xla 2.x) in `lightning.pytorch` and `lightning.lite`. `lightning.app` is upstream's, "
        "unchanged.\n"
    )
    return _metadata("lightning", version, "Lightning 1.8.6 (unified package) with the Lightning XLA fork's "
                     "patch queue for Cloud TPUs", requires, extras, description,
                     header_extra=["Home-page: https://github.com/Lightning-AI/lightning"])


def lite_metadata(version: str) -> str:
    description = (
        "# lightning-lite (Lightning XLA fork)\n\n"
        "Lightning Lite 1.8.6 with the Lightning XLA fork's patch queue for Cloud TPUs (PJRT, torch_xla 2.x).\n"
    )
    return _metadata("lightning-lite", version, "Lightning Lite 1.8.6 with the Lightning XLA fork's patch queue "
                     "for Cloud TPUs", LITE_REQUIRES,
                     {name: TORCH[name] for name in ("xla", "tpu", "torchtpu")}, description)


def build_lite_wheel(src: Path, dist_dir: Path) -> Path:
    version = src_version(src)
    files = {f"lightning_lite/{rel}": p.read_bytes() for rel, p in tree_files(src / "lightning_lite").items()}
    return write_wheel(dist_dir, "lightning-lite", version, files, lite_metadata(version))


def build_unified_wheel(src: Path, dist_dir: Path, lock: Optional[Dict] = None,
                        cache_dir: Optional[Path] = None) -> Path:
    version = src_version(src)
    upstream = unified_wheel(lock, cache_dir)
    files = unified_files(src, upstream, version)
    extra_info = {}
    with zipfile.ZipFile(upstream) as zf:
        info_dir = next(n.split("/", 1)[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        upstream_metadata = zf.read(f"{info_dir}/METADATA").decode()
        for name in ("entry_points.txt", "LICENSE"):
            if f"{info_dir}/{name}" in zf.namelist():
                extra_info[name] = zf.read(f"{info_dir}/{name}")
    return write_wheel(dist_dir, UNIFIED_DIST, version, files, lightning_metadata(upstream_metadata, version),
                       extra_info)


def build_pytorch_lightning_wheel(src: Path, dist_dir: Path, python: str = sys.executable) -> Path:
    """The ``setup.py`` build of the fork's pytorch-lightning from a materialized ``src`` anywhere (tests)."""
    repo, tools = common.ROOT, common.ROOT / "tools"
    with tempfile.TemporaryDirectory() as tmp:
        proj = Path(tmp) / "proj"
        (proj / "tools").mkdir(parents=True)
        for name in ("setup.py", "pyproject.toml", "README.md", "requirements/runtime.txt", "requirements/torchtpu.txt"):
            (proj / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(repo / name, proj / name)
        shutil.copy2(tools / "fork.py", proj / "tools" / "fork.py")
        shutil.copytree(tools / "forkq", proj / "tools" / "forkq", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(src, proj / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        out = Path(tmp) / "out"
        proc = subprocess.run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                               "--disable-pip-version-check", "-w", str(out), str(proj)],
                              capture_output=True, text=True)
        wheels = list(out.glob("*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise ForkError(f"setup.py build failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}")
        dist_dir.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheels[0], dist_dir / wheels[0].name))


# --------------------------------------------------------------------------------------------- upstream check
def compare_upstream(lock: Optional[Dict] = None, cache_dir: Optional[Path] = None) -> Dict[str, List[str]]:
    """Apply the substitution to upstream pytorch-lightning 1.8.6's trees and compare them file for file with
    upstream's unified wheel. Returns ``{"equal": [...], "differ": [...], "only_generated": [...],
    "only_upstream": [...]}`` (archive names under lightning/pytorch and lightning/lite)."""
    lock = read_lock() if lock is None else lock
    pl = fetch_wheel("pytorch-lightning", lock["pytorch-lightning"], cache_dir)
    generated: Dict[str, bytes] = {}
    with zipfile.ZipFile(pl) as zf:
        for name in zf.namelist():
            pkg, _, rel = name.partition("/")
            if pkg in UNIFIED_DIRS and rel and not name.endswith("/"):
                generated[f"{UNIFIED_DIRS[pkg]}/{rel}"] = substitute(zf.read(name))
    upstream: Dict[str, bytes] = {}
    with zipfile.ZipFile(unified_wheel(lock, cache_dir)) as zf:
        for name in zf.namelist():
            if name.startswith(tuple(d + "/" for d in UNIFIED_DIRS.values())) and not name.endswith("/"):
                upstream[name] = zf.read(name)
    common = sorted(set(generated) & set(upstream))
    return {
        "equal": [n for n in common if generated[n] == upstream[n]],
        "differ": [n for n in common if generated[n] != upstream[n]],
        "only_generated": sorted(set(generated) - set(upstream)),
        "only_upstream": sorted(set(upstream) - set(generated)),
    }
