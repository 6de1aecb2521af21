"""The fork's upstream fixes (``Kind: fix`` patches) as a numbered ``git am`` series for upstream's tag 1.8.6, one
module a job:

- ``testmodules``: the fork's test modules that prove a fix (``FIXED_BY``), rewritten for upstream's test suite, and
  the upstream tests a fix updates;
- ``export``: the series itself (``build/pr-series``), one mbox a fix, with its tests;
- ``verify``: the repository standing for tag 1.8.6 (the pinned wheel's tree) and the ``git am`` check that the
  series, applied there, equals upstream plus the fix patches;
- ``doc``: ``docs/upstream-prs.md``, rendered from the series, the 2.6.6 series and the last ``check-tag``;
- ``check_tag``: the series on upstream's real tag, its tests collected and run under upstream's configuration.

``python3 tools/fork.py pr-series export | check-tag`` runs them.
"""
