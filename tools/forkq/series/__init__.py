"""The fork's fixes as upstream series: ``pr186`` (a ``git am`` series for upstream's tag 1.8.6), ``pr266`` (pull
requests against Lightning 2.6.6, ``patches/2.6.6``), ``before_after`` (each 1.8.6 fix's tests fail without it and
pass with it), all on one engine (``engine``: run pytest, read its JUnit report, judge the flip)."""
