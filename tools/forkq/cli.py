"""``python3 tools/fork.py``: materialize upstream Lightning 1.8.6 plus the patch queue, and maintain the queue.

Commands::

    fork.py materialize [--upto NAME] [--dest DIR] [--force] [--cache-dir DIR]
    fork.py check
    fork.py refresh NAME
    fork.py restat NAME
    fork.py new NAME --subject S --body-file F --kind compat|fix|feature --forwarded no|not-needed|URL
                [--bug URL] [--origin vendor|'<upstream|backport|other>, URL'] [--applied-upstream 'VERSION, URL']
    fork.py series-comments [--write]
    fork.py version
    fork.py readme [--check]
    fork.py list

The layout of every materialized tree is the layout of upstream's git tag ``1.8.6``: ``src/pytorch_lightning``
and ``src/lightning_lite``. Patches are ``git format-patch`` files against that tag, listed in order in
``patches/1.8.6/series``; ``patches/2.6.6/`` holds the fixes as pull requests against Lightning 2.6.6. A patch that
changes upstream behaviour on purpose also updates upstream's tests of it: its sections under ``tests/`` are diffs
against the tag's test files, skipped by materialize (see ``patchfile.split_diff``).
"""
import argparse
import signal
import sys
from pathlib import Path
from typing import Optional, Sequence

from . import common
from .authoring import (check, missing_changes_block, new_patch, refresh, restat, has_changes_block, sync_readme)
from .common import KINDS, ForkError, Terminated
from .patchfile import BASES, Patch, read_series, read_series_text, series_text, write_series_comments
from .tree import fork_version, materialize


def series_comments(write: bool) -> int:
    """Check (or with ``write``, rewrite) the comment lines of both series files from the patch headers."""
    stale = []
    for base in BASES.values():
        if write and write_series_comments(base.patch_dir):
            print(f"wrote the comment lines of {base.patch_dir.relative_to(common.ROOT)}/series")
        elif read_series_text(base.patch_dir) != series_text(base.patch_dir):
            stale.append(f"{base.patch_dir.relative_to(common.ROOT)}/series")
    if stale:
        raise ForkError(f"the comment lines of {', '.join(stale)} are not those of the patch headers; "
                        "`python3 tools/fork.py series-comments --write` writes them")
    if not write:
        print("the series files' comment lines are current")
    return 0


def readme(check_only: bool) -> int:
    path = common.README
    current = sync_readme(check_only=check_only)
    if not current and check_only:
        raise ForkError(f"{path.name}'s generated blocks are stale; `python3 tools/fork.py readme` writes them "
                        f"(version {fork_version()})")
    print(f"{path.name}: the version example is {fork_version()}" if current
          else f"{path.name}: generated blocks updated (version {fork_version()})")
    if not has_changes_block(path.read_text()):
        raise ForkError(missing_changes_block(path))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="fork.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("materialize", help="write upstream + the series (or a prefix) to src/")
    p.add_argument("--upto", default=None, help="last patch to apply (name or number); 'upstream' for none")
    p.add_argument("--dest", type=Path, default=common.ROOT / "src")
    p.add_argument("--force", action="store_true", help="rebuild even when up to date, discarding local edits")
    p.add_argument("--cache-dir", type=Path, default=common.CACHE_DIR, help="where the pinned upstream wheel is kept")
    sub.add_parser("check", help="both queues: the header rules, the series files, and that each series applies")
    p = sub.add_parser("refresh", help="rewrite a patch from the edits in src/")
    p.add_argument("name")
    p = sub.add_parser("new", help="turn the edits in src/ into a new patch at the end of the series")
    p.add_argument("name")
    p.add_argument("--subject", required=True)
    p.add_argument("--body-file", type=Path, required=True)
    p.add_argument("--kind", required=True, choices=KINDS)
    p.add_argument("--bug", default=None, help="the upstream issue: one https:// URL (leave out when there is none)")
    p.add_argument("--forwarded", required=True, help="`no`, `not-needed`, or the URL of the upstream pull request")
    p.add_argument("--origin", default="vendor",
                   help="`vendor` (written by the fork; the default) or `<upstream|backport|other>, <URL>`")
    p.add_argument("--applied-upstream", default=None, help="a backport's `<version>, <URL>`")
    p = sub.add_parser("restat", help="redraw a patch's diffstat after sections under tests/ were added by hand")
    p.add_argument("name")
    p = sub.add_parser("series-comments", help="check the series files' comment lines against the patch headers")
    p.add_argument("--write", action="store_true", help="rewrite them from the headers")
    sub.add_parser("version", help="print the fork's version")
    p = sub.add_parser("readme", help="write the README's generated blocks: the version example, the table of changes")
    p.add_argument("--check", action="store_true", help="only check them (exit 1 when they are stale)")
    sub.add_parser("list", help="print the series with each patch's kind and subject")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "materialize":
            materialize(args.dest, args.upto, args.force, cache_dir=args.cache_dir)
        elif args.cmd == "check":
            return check()
        elif args.cmd == "refresh":
            refresh(args.name)
        elif args.cmd == "restat":
            restat(args.name)
        elif args.cmd == "new":
            new_patch(args.name, args.subject, args.body_file.read_text(), args.kind, args.bug or None,
                      args.forwarded, args.origin, applied_upstream=args.applied_upstream or None)
        elif args.cmd == "series-comments":
            return series_comments(args.write)
        elif args.cmd == "version":
            print(fork_version())
        elif args.cmd == "readme":
            return readme(args.check)
        elif args.cmd == "list":
            for n in read_series():
                patch = Patch.read(common.PATCH_DIR / n)
                print(f"{n}  [{patch.kind or '?'}]  {patch.subject}")
    except ForkError as err:
        print(f"fork.py: error: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as err:
        signum = err.signum if isinstance(err, Terminated) else signal.SIGINT
        print(f"fork.py: interrupted ({signal.Signals(signum).name}); nothing half-written was left behind",
              file=sys.stderr)
        return 128 + int(signum)
    return 0
