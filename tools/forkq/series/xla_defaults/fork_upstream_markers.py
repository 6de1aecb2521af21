"""A pytest plugin that declares the markers upstream's 1.8.6 tests take from plugins not installed here.

``forkq.series.upstream_tests`` loads it (``-p fork_upstream_markers``) on the CPU and on XLA. Upstream marks a few
tests ``@pytest.mark.flaky(reruns=...)``, pytest-rerunfailures' marker; without that plugin, ``--strict-markers``
(upstream's ``setup.cfg``) refuses the marker and the whole module fails to load (``profilers/test_profiler.py``,
``models/test_amp.py``). Declared here, those modules load and each of their tests runs once: a rerun would hide the
very differences the comparison looks for.
"""
from typing import Any


def pytest_configure(config: Any) -> None:
    if not config.pluginmanager.hasplugin("rerunfailures"):
        config.addinivalue_line("markers", "flaky(reruns, reruns_delay): pytest-rerunfailures' marker; runs once here")
