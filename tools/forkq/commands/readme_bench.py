"""``fork.py readme-bench`` (``tools/readme_bench.py``, run by ``make bench``): the latest benchmark tables of
``results/`` in ``bench/README.md`` and the device-bound headline in ``README.md`` (``forkq.bench_readme``)."""
from ..bench_readme import update
from ..cli import Command


class ReadmeBench(Command):
    def run(self, args):
        return update()
