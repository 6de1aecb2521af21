"""The fork's fixes as upstream series and their proofs: ``pr186`` (a ``git am`` series for upstream's tag 1.8.6, one
module a job), ``pr266`` (pull requests against Lightning 2.6.6, ``patches/2.6.6``), ``before_after`` (each 1.8.6 fix's
tests fail without it and pass with it), ``upstream_tests`` (upstream's own tests on the compat patches and on the
series), all on one pytest runner and one reader of its results (``engine``)."""
