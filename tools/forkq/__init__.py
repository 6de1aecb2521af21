"""forkq: the tools of the Lightning XLA fork's patch queue, as one package.

Modules:

- ``common``: paths of the checkout, the two bases (``patches/1.8.6``, ``patches/2.6.6``), ForkError, git.
- ``upstream``: the lock file, the pinned wheels and their one cache (``.cache/upstream``), runtime pins.
- ``pythons``: the Pythons and the platform the pinned stack has wheels for (any Python 3 can import it).
- ``seriesfile``: the series files; ``patchfile``: the ``Patch`` object (the one reader of a patch's header and
  kind), diff sections, diffstats, CHANGELOG lines; ``rules``: the header rules and a queue checked against them;
  ``seriescomments``: the series files' comment lines; ``fixedby``: the one reader of ``FIXED_BY``.
- ``tree``: materialize upstream plus the series (atomic swap, lock, stamps, versions).
- ``authoring``: refresh, restat, new, check, series comments, the generated blocks of the README and
  docs/patches.md.
- ``blocks``: the one splicer of generated blocks; ``refs``: patch references that cannot go stale;
  ``commitmsg``: the commit message rule and its hook.
- ``unified``: the lightning-lite and unified lightning wheels; ``bench_readme``: the benchmark tables in the READMEs.
- ``series``: the upstream series (1.8.6 ``git am`` series, 2.6.6 pull requests), before/after, upstream's own
  tests on the series, and the one pytest runner they share (``series.engine``).
- ``commands``: the command table, one module a command, and ``Command`` (``commands.base``); ``cli``:
  ``python3 tools/fork.py ...`` over the table (no module imports it).

Only the standard library, pip and git are used by ``common``, ``upstream``, ``pythons``, ``seriesfile`` and ``tree``,
so that ``setup.py`` can materialize ``src/`` inside pip's isolated build environment. This file stays free of
f-strings and annotations: ``tools/check_python.py`` imports ``forkq.pythons`` with whatever Python 3 it is given.
"""
