"""The fork's benchmarks, a package run from the checkout's root as ``python -m bench.<driver>`` (the Makefile's
``bench*`` targets do).

- ``trees``: which Lightning each row runs (a tree of the fork, the fork in the venv, Lightning 2.6.6 installed
  apart, or none) and the environment of the row's process; sets ``PJRT_DEVICE`` when a driver asks it to.
- ``report``: every result under ``results/`` is written there, stamped with what it measured (the fork's version
  and series digest, the date, the machine); the graph benchmark's tables and plot.
- ``bench_rows``: the measuring machinery that runs inside a row's process (``Recorder``, ``PairedReference``, the
  hand-written loops, the Trainer and Lite rows); ``patterns``: the everyday patterns, one definition each.
- the drivers: ``graph_bench`` (``make bench``), ``host_bench`` (``make bench-host``), ``host_profile``
  (``make bench-host-profile``), ``device_bench`` (``make bench-device``), ``spmd_bench`` (``make bench-spmd``).

Nothing here loads a module by path or edits ``sys.path``: the drivers start their rows' processes with
``python -m bench.<module>`` from the checkout's root (``trees.module_command``), and the tests import
``bench.<module>`` with the root on ``sys.path`` (``pythonpath`` in pyproject.toml).
"""
