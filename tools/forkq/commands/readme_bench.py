"""``fork.py readme-bench``: the latest benchmark tables of
``results/`` in ``bench/README.md`` and the device-bound headline in ``README.md`` (``forkq.bench_readme``)."""
from ..bench_readme import update
from .base import Command


class ReadmeBench(Command):
    def run(self, args):
        return update()
