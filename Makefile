# Lightning XLA fork. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip --disable-pip-version-check -q
# XLA on the CPU unless this host has TPU chips (TPU VMs expose /dev/accel* or /dev/vfio/*)
PJRT_DEVICE ?= $(shell ls /dev/accel0 /dev/vfio/0 >/dev/null 2>&1 && echo TPU || echo CPU)
export PJRT_DEVICE
# pytest-xdist workers; each gets its own XLA:CPU runtime
WORKERS ?= 2
UPTO ?=
PATCH ?=
# FORCE=1: `make fork` rebuilds src/ even when it holds local edits (they are lost)
FORCE ?=

.PHONY: help venv fork fork-upto check-series refresh new-patch install dist pr-series upstream-tests test demo bench bench-host bench-spmd before-after clean

help:
	@echo "make demo          install everything, train the example on XLA (PJRT_DEVICE=$(PJRT_DEVICE)) and print per-step graph counts"
	@echo "make test          install everything and run the whole test suite"
	@echo "make fork [UPTO=N] [FORCE=1]  materialize upstream 1.8.6 + patches/series (or up to patch N) into src/"
	@echo "make refresh PATCH=NAME   rewrite patch NAME from edits in src/ (src/ must hold the series up to NAME)"
	@echo "make new-patch NAME=... SUBJECT=... BODY=file KIND=fix|compat BUG=url FORWARDED=no"
	@echo "make check-series  every patch has its header and the whole series applies cleanly"
	@echo "make dist          build the fork's wheels (pytorch-lightning, lightning-lite, lightning) into dist/"
	@echo "make pr-series     both upstream series as mbox patches (build/pr-series/ for 1.8.6, build/pr-series-2.6.6/) and docs/upstream-prs.md"
	@echo "make before-after  each fix's tests fail without its patch and pass with it"
	@echo "make upstream-tests UPSTREAM=DIR  upstream's own 1.8.6 tests (a clone of upstream in DIR) on the compat patches alone and on the series, compared"
	@echo "make bench         the graph benchmark and the host CPU benchmark (results/)"
	@echo "make bench-host    host CPU per step: fork, Lightning 2.6.6, Lite, hand loop, in lock-stepped pairs (results/host.md)"
	@echo "make bench-spmd    the SPMD benchmark on 4 XLA:CPU devices or all TPU chips (results/spmd.md)"

# the interpreter check runs before anything is created or downloaded (tools/check_python.py: the Pythons and the
# platform with wheels of the pinned torch and torch_xla, from requirements/runtime.txt)
$(VENV)/.installed-requirements: requirements/runtime.txt requirements/test.txt requirements/build.txt
	@$(PYTHON) tools/check_python.py
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) tools/check_python.py
	$(PIP) install --upgrade "pip>=24"
	$(PIP) install -r requirements/test.txt
	touch $@

venv: $(VENV)/.installed-requirements

fork:
	$(PYTHON) tools/fork.py materialize $(if $(UPTO),--upto $(UPTO)) $(if $(FORCE),--force)

check-series:
	$(PYTHON) tools/fork.py check

refresh:
	$(PYTHON) tools/fork.py refresh $(PATCH)

new-patch:
	$(PYTHON) tools/fork.py new $(NAME) --subject "$(SUBJECT)" --body-file $(BODY) --kind $(KIND) --bug "$(BUG)" --forwarded "$(FORWARDED)"

# the installed (non-editable) fork is what the tests and the demo import
install: venv
	$(PYTHON) tools/fork.py materialize
	$(PIP) install --no-deps --no-build-isolation --force-reinstall .

# three wheels from the one series: pytorch-lightning (setup.py), lightning-lite and the unified lightning
# (tools/unified.py; lightning.app comes unchanged from the pinned upstream lightning wheel)
dist: venv
	$(PYTHON) tools/fork.py materialize
	rm -f dist/pytorch_lightning-*.whl dist/lightning_lite-*.whl dist/lightning-*.whl
	$(VPY) -m pip wheel --no-deps --no-build-isolation -q -w dist .
	$(VPY) tools/unified.py wheels --src src --dist dist
	@ls -1 dist/*.whl

# the fixes (Kind: fix) as a git am series for upstream's tag 1.8.6, the fixes for Lightning 2.6.6 (patches-2.6.6/)
# as one pull request each against its source layout, and docs/upstream-prs.md for both
pr-series:
	$(PYTHON) tools/pr_series.py export --out build/pr-series --doc docs/upstream-prs.md
	$(PYTHON) tools/pr_series_266.py export --out build/pr-series-2.6.6

test: install
	$(VPY) -m pytest -n $(WORKERS) -p no:cacheprovider tests

demo: install
	$(VPY) examples/train_xla.py

before-after: venv
	$(VPY) tools/before_after.py

# upstream's own 1.8.6 tests (tests/ of tag 1.8.6 in UPSTREAM: a clone of Lightning-AI/lightning, or its .git) on the
# compat patches alone and on the whole series, with PJRT_DEVICE unset; results/upstream-tests-1.8.6.json
UPSTREAM ?=
upstream-tests: venv
	@test -n "$(UPSTREAM)" || { echo "make upstream-tests UPSTREAM=<a clone of Lightning-AI/lightning with tag 1.8.6>"; exit 2; }
	env -u PJRT_DEVICE $(VPY) tools/upstream_tests.py run --upstream $(UPSTREAM)

# the Lightning 2.6.6 series (patches-2.6.6/): each patch's tests fail on 2.6.6 without it and pass with it, on XLA:CPU
.PHONY: verify-2.6.6
verify-2.6.6: venv
	$(VPY) tools/pr_series_266.py verify

# BENCH_ARGS: e.g. "--quick", "--rows xla-loop,fork --sizes small" (bench/graph_bench.py --help)
BENCH_ARGS ?=
bench: install
	$(PIP) install -r requirements/bench.txt
	$(VPY) bench/graph_bench.py $(BENCH_ARGS)
	$(VPY) bench/host_bench.py $(HOST_BENCH_ARGS)
	$(PYTHON) tools/readme_bench.py

# host CPU per step only (results/host.md): the fork, Lightning 2.6.6, Lite and the hand loop in lock-stepped pairs
bench-host: install
	$(VPY) bench/host_bench.py $(HOST_BENCH_ARGS)
	$(PYTHON) tools/readme_bench.py

# one process drives every XLA device: CPU_NUM_DEVICES of them on XLA:CPU, every chip of the host on a TPU VM
CPU_NUM_DEVICES ?= 4
bench-spmd: install
	CPU_NUM_DEVICES=$(CPU_NUM_DEVICES) $(VPY) bench/spmd_bench.py $(BENCH_ARGS)

clean:
	rm -rf src build dist *.egg-info .fork-staging-* .fork-*.lock
