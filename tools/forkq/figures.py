"""Every figure under ``results/``: what measures it, what it depends on, whether it is current, and one run of them all.

Each result is measured by one command and depends on one thing (:data:`FIGURES`):

- ``series``: the whole 1.8.6 series (the benchmarks, upstream's tests on the series): current when its stamp's
  digest is the series now in ``patches/1.8.6``;
- ``compat``: the compat patches only (the baseline of upstream's tests on XLA, measured on the compat tree): current
  when the compat tree it measured is the one the series gives now;
- ``fixes``: the fix and compat patches only (the PR series checked on upstream's tag, the compat patches applied on
  top): current when the tree of those patches it checked (its stamp's ``inputs``) is the one the series gives now,
  so that a change of a feature patch leaves it current.

``fork.py figures check`` lists the results that are not current, each with the command that measures it again;
``fork.py figures run`` runs those commands (all of them, the ones named, or ``--stale`` only), times each, rewrites
the pages that quote results (``readme-bench``) and says how long it all took. ``every_stop`` marks the results cheap
enough to refresh at every stop that changes a patch; the rest take long on 2 cores (the minutes of the last run are
kept in ``results/figures.json``) and are refreshed when their input changes, which the check says.

The check fails (``fork.py check``) only on a page that shows figures of another series without saying so
(``bench_readme.stale_blocks``); a stale result the pages do not show is listed, not refused.
"""
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from . import common
from . import stamp as fork_stamp
from .patchfile import Patch
from .seriesfile import read_series
from .tree import fork_version

RESULTS = common.ROOT / "results"
#: the minutes of the last `figures run` of each result, stamped
TIMES = RESULTS / "figures.json"


@dataclass(frozen=True)
class Figure:
    """One result: its files under ``results/``, the ``make`` target that measures it again, what it depends on
    (``series`` or ``compat``), and whether it is cheap enough for every stop that changes a patch."""

    name: str
    files: Tuple[str, ...]
    make: str
    depends_on: str = "series"
    every_stop: bool = False
    #: what the README's headline or bench/README.md quotes from it
    shown: bool = False

    @property
    def command(self) -> str:
        return f"make {self.make}"


#: every result under results/, in the order `figures run` measures them: what the README shows first
FIGURES: Tuple[Figure, ...] = (
    Figure("checkpoint", ("checkpoint.json", "checkpoint.md"), "bench-checkpoint", every_stop=True, shown=True),
    Figure("host", ("host.json", "host.md"), "bench-host", every_stop=True, shown=True),
    Figure("device", ("device.json", "device.md"), "bench-device", shown=True),
    Figure("llm", ("llm.json", "llm.md"), "bench-llm", shown=True),
    Figure("bench", ("bench.json", "bench.md", "bench.png"), "bench-graph", shown=True),
    Figure("upstream-tests-xla", ("upstream-tests-xla-1.8.6.json",), "upstream-tests-xla-check UPSTREAM=$UPSTREAM",
           every_stop=True),
    Figure("upstream-tests", ("upstream-tests-1.8.6.json",), "upstream-tests UPSTREAM=$UPSTREAM", every_stop=True),
    # the same comparison on the TorchTPU stack (torch 2.14)
    Figure("upstream-tests-torchtpu", ("upstream-tests-1.8.6-torchtpu.json",),
           "upstream-tests STACK=torchtpu UPSTREAM=$UPSTREAM", every_stop=True),
    Figure("upstream-test-edits", ("upstream-test-edits-1.8.6.json",), "upstream-test-edits UPSTREAM=$UPSTREAM",
           every_stop=True),
    Figure("spmd", ("spmd.json", "spmd.md"), "bench-spmd"),
    Figure("host-profile", ("host-profile.json", "host-profile.md"), "bench-host-profile"),
    Figure("pr-series", ("pr-series-1.8.6.json",), "pr-series-check UPSTREAM=$UPSTREAM", depends_on="fixes"),
    Figure("upstream-tests-xla-compat", ("upstream-tests-xla-1.8.6-compat.json",),
           "upstream-tests-xla UPSTREAM=$UPSTREAM", depends_on="compat"),
)


def by_name() -> Dict[str, Figure]:
    return {f.name: f for f in FIGURES}


def compat_version(patch_dir: Optional[Path] = None, left_out: Sequence[str] = ()) -> str:
    """The version of the compat tree the series gives now (its compat patches, in order), without ``left_out``: the
    compat patches that the run of upstream's tests left out of that tree, because every line they change is one the
    fix patches add (``upstream_tests.tree_patches``; the result names them)."""
    return _version_of_kinds(("compat",), patch_dir, left_out)


def fixes_version(patch_dir: Optional[Path] = None) -> str:
    """The version of the tree of the series' fix and compat patches, in order: what the PR series check applies."""
    return _version_of_kinds(("fix", "compat"), patch_dir)


def _version_of_kinds(kinds: Tuple[str, ...], patch_dir: Optional[Path], left_out: Sequence[str] = ()) -> str:
    patch_dir = common.PATCH_DIR if patch_dir is None else patch_dir
    names = [n for n in read_series(patch_dir / "series")
             if n not in left_out and Patch.read(patch_dir / n).kind in kinds]
    return fork_version(series=names, patch_dir=patch_dir)


def _read(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def why_stale(figure: Figure, results: Path = RESULTS, digest: Optional[str] = None,
              compat: Optional[str] = None, fixes: Optional[str] = None, patch_dir: Optional[Path] = None
              ) -> Optional[str]:
    """Why ``figure``'s result is not the current series' own (missing, unstamped, measured another series, another
    compat tree or other fix patches), or ``None``."""
    data = _read(results / figure.files[0])
    if data is None:
        return f"results/{figure.files[0]} is missing"
    st = data.get("stamp")
    if not st:
        return f"results/{figure.files[0]} carries no stamp"
    if figure.depends_on == "compat":
        left_out = sorted(data.get("left_out") or {})
        compat = compat_version(patch_dir, left_out) if compat is None or left_out else compat
        if data.get("version") != compat:
            return f"it measured the compat tree {data.get('version')}, and the series' compat patches now give {compat}"
        return None
    if figure.depends_on == "fixes":
        fixes = fixes_version() if fixes is None else fixes
        if st.get("inputs") != fixes:
            return (f"it checked the fix and compat patches of {st.get('inputs') or 'an unrecorded tree'}, and the series"
                    f" now gives {fixes}")
        return None
    digest = fork_stamp.current_digest() if digest is None else digest
    if not fork_stamp.is_current(st, digest):
        return f"it measured the fork {st.get('fork')} on {st.get('date')}, not the series now in patches/1.8.6"
    return None


def stale(results: Path = RESULTS, names: Optional[Sequence[str]] = None, patch_dir: Optional[Path] = None
          ) -> List[Tuple[Figure, str]]:
    """The results that are not current for the series in ``patch_dir`` (``patches/1.8.6``), each with why."""
    digest, compat, fixes = fork_stamp.current_digest(patch_dir), compat_version(patch_dir), fixes_version(patch_dir)
    chosen = [f for f in FIGURES if names is None or f.name in names]
    out = []
    for figure in chosen:
        why = why_stale(figure, results, digest, compat, fixes, patch_dir)
        if why is not None:
            out.append((figure, why))
    return out


def report(results: Path = RESULTS, patch_dir: Optional[Path] = None) -> List[str]:
    """One line per result that is not current: its files, why, and the command that measures it again."""
    times = (_read(results / TIMES.name) or {}).get("minutes", {})
    lines = []
    for figure, why in stale(results, patch_dir=patch_dir):
        took = f", about {times[figure.name]:.0f} min" if figure.name in times else ""
        when = "cheap: at every stop that changes a patch" if figure.every_stop else "long: when its input changes"
        lines.append(f"results/{figure.files[0]}: {why}; `{figure.command}` measures it again ({when}{took})")
    return lines


def check() -> int:
    """Print the results that are not current (``fork.py figures check``); exit 1 if there is one."""
    lines = report()
    if not lines:
        print(f"figures: every result under results/ is the series {fork_version()}'s own")
        return 0
    print(f"figures: {len(lines)} of {len(FIGURES)} results are not the series {fork_version()}'s own:")
    for line in lines:
        print(f"  {line}")
    return 1


def _upstream() -> str:
    upstream = os.environ.get("UPSTREAM", "/work/.mirror/Lightning-AI+lightning/repo")
    return upstream


def run(names: Optional[Sequence[str]] = None, only_stale: bool = False, every_stop: bool = False,
        make: Sequence[str] = ("make", "-o", "install", "-o", "venv")) -> int:
    """Measure the chosen results again (``names``; the stale ones; those of every stop; or all), each with its own
    command, then rewrite the pages that quote them; print how long each took. Returns non-zero if a command
    failed (the others still run)."""
    known = by_name()
    unknown = [n for n in names or () if n not in known]
    if unknown:
        raise common.ForkError(f"no result named {', '.join(unknown)}; the results: {', '.join(known)}")
    chosen = [f for f in FIGURES if (not names or f.name in names) and (not every_stop or f.every_stop)]
    if only_stale:
        stale_names = {f.name for f, _ in stale(names=[f.name for f in chosen])}
        chosen = [f for f in chosen if f.name in stale_names]
    times = _read(TIMES) or {}
    minutes: Dict[str, float] = dict(times.get("minutes", {}))
    failed = []
    start = time.monotonic()
    for figure in chosen:
        target = figure.make.replace("$UPSTREAM", _upstream()).split()
        print(f"figures: {figure.name}: {' '.join([*make, *target])}", flush=True)
        t0 = time.monotonic()
        code = subprocess.call([*make, *target], cwd=common.ROOT)
        took = (time.monotonic() - t0) / 60
        print(f"figures: {figure.name}: {'done' if code == 0 else f'FAILED (exit {code})'} in {took:.1f} min",
              flush=True)
        if code == 0:
            minutes[figure.name] = round(took, 1)
        else:
            failed.append(figure.name)
    code = subprocess.call([sys.executable, str(common.ROOT / "tools" / "fork.py"), "readme-bench"], cwd=common.ROOT)
    if chosen:
        TIMES.write_text(json.dumps({"stamp": fork_stamp.make(), "minutes": minutes}, indent=1) + "\n")
    total = (time.monotonic() - start) / 60
    print(f"figures: {len(chosen) - len(failed)} of {len(chosen)} results measured again in {total:.1f} min"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    left = report()
    if left:
        print("figures: still not current:\n  " + "\n  ".join(left))
    return 1 if failed or code else 0
