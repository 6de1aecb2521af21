"""``fork.py commit-msg FILE | --since BASE`` (the ``commit-msg`` hook, ``make check-commits``, CI): the rule for
this repository's commit messages (``forkq.commitmsg``)."""
import sys
from pathlib import Path

from .. import common
from .base import Command
from ..commitmsg import SUBJECT_MAX, clean, commits_since, problems


class CommitMsg(Command):
    def add_arguments(self, parser):
        what = parser.add_mutually_exclusive_group(required=True)
        what.add_argument("file", nargs="?", type=Path, help="a message file (what git hands the commit-msg hook)")
        what.add_argument("--since", metavar="BASE",
                          help="check the commits HEAD has and BASE does not (merges left out); a BASE that names "
                               "no commit here (none given, all zeros) checks nothing and says so")

    def run(self, args):
        if args.file is not None:
            found = problems(args.file.read_text())
            for problem in found:
                print(f"{args.prog}: commit message: {problem}", file=sys.stderr)
            if found:
                print(f"{args.prog}: the commit was refused; the message is kept in {args.file} (subject <= "
                      f"{SUBJECT_MAX} characters, a blank line, a body; no patch numbers)", file=sys.stderr)
            return 1 if found else 0
        commits = commits_since(args.since, common.ROOT)
        if commits is None:
            print(f"{args.prog}: no base to compare against ({args.since!r} names no commit here): no commit "
                  "message checked")
            return 0
        bad = 0
        for sha, message in commits:
            found = problems(message)
            bad += bool(found)
            for problem in found:
                print(f"{sha} {clean(message).splitlines()[0][:60]!r}: {problem}")
        print(f"{len(commits)} commit(s) since {args.since}: "
              + (f"{bad} break the commit message rule of docs/maintaining.md" if bad else "every message follows "
                 "the rule"))
        return 1 if bad else 0
