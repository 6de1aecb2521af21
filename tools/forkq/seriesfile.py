"""The series files (``patches/1.8.6/series``, ``patches/2.6.6/series``): the patch names of a queue, in order, and
the prefix of it that ends at a given patch. Standard library only (``materialize`` reads them inside pip's build)."""
from pathlib import Path
from typing import List, Optional, Sequence

from . import common
from .common import ForkError


def read_series(series_file: Optional[Path] = None) -> List[str]:
    """The patch names of the series, in order; blank lines and ``#`` comments are ignored."""
    series_file = common.SERIES_FILE if series_file is None else series_file
    if not series_file.exists():
        return []
    names = []
    for line in series_file.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    if len(set(names)) != len(names):
        raise ForkError(f"{series_file} names a patch twice")
    for name in names:
        if not (series_file.parent / name).is_file():
            raise ForkError(f"{series_file} names {name!r}, but {series_file.parent / name} does not exist")
    return names


def resolve_upto(series: Sequence[str], upto: Optional[str]) -> List[str]:
    """The prefix of ``series`` that ends with ``upto`` (a file name, or its number prefix such as ``0003``)."""
    if upto is None:
        return list(series)
    if upto in ("", "0", "none", "upstream"):
        return []
    name = common.match_patch(series, upto)
    if name is None:
        raise ForkError(f"--upto {upto!r} matches no single patch of the series; the series is: {', '.join(series)}")
    return list(series[: list(series).index(name) + 1])
