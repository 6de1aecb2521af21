"""The comment line above each patch in a series file (kind, subject, upstream link), drawn from the patch headers:
``series-comments --write`` writes them, ``check`` refuses stale ones. Standard library only."""
from pathlib import Path
from typing import List

from .patchfile import Patch, upstream_link
from .seriesfile import read_series


def series_comment(path: Path) -> str:
    """The comment line above a patch in its series: kind, subject, upstream link (when the header has one)."""
    patch = Patch.read(path)
    link = upstream_link(patch.trailers)
    return "# " + (f"[{patch.kind}] " if patch.kind else "") + patch.subject + (f" <{link}>" if link else "")


def read_series_text(patch_dir: Path) -> str:
    path = patch_dir / "series"
    return path.read_text() if path.exists() else ""


def series_text(patch_dir: Path) -> str:
    """The series file as ``series-comments --write`` writes it: its introduction (the leading comment lines up to
    the first blank line) as it is, then each patch's name under its comment line."""
    current = read_series_text(patch_dir)
    lines = current.splitlines()
    intro: List[str] = []
    if "" in lines and all(line.startswith("#") for line in lines[: lines.index("")]):
        intro = lines[: lines.index("")] + [""]
    out = intro + [line for name in read_series(patch_dir / "series")
                   for line in (series_comment(patch_dir / name), name)]
    return "\n".join(out) + "\n"


def write_series_comments(patch_dir: Path) -> bool:
    """Rewrite the comment lines of ``patch_dir/series`` from the headers; True when the file changed."""
    wanted = series_text(patch_dir)
    if wanted == read_series_text(patch_dir):
        return False
    (patch_dir / "series").write_text(wanted)
    return True
