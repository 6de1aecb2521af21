"""``fork.py version``: the fork's version (``1.8.6+xla.N.gXXXXXXXX``)."""
from .base import Command
from ..tree import fork_version


class Version(Command):
    def run(self, args):
        print(fork_version())
        return 0
