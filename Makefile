# Lightning XLA fork. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VPY) -m pip --disable-pip-version-check -q
PJRT_DEVICE ?= CPU
export PJRT_DEVICE
# pytest-xdist workers; each gets its own XLA:CPU runtime
WORKERS ?= 2
UPTO ?=
PATCH ?=

.PHONY: help venv fork fork-upto check-series refresh new-patch install dist test demo bench before-after clean

help:
	@echo "make demo          install everything, train the example on XLA (PJRT_DEVICE=$(PJRT_DEVICE)) and print per-step graph counts"
	@echo "make test          install everything and run the whole test suite"
	@echo "make fork [UPTO=N] materialize upstream 1.8.6 + patches/series (or up to patch N) into src/"
	@echo "make refresh PATCH=NAME   rewrite patch NAME from edits in src/ (src/ must hold the series up to NAME)"
	@echo "make new-patch NAME=... SUBJECT=... BODY=file KIND=fix|compat BUG=url FORWARDED=no"
	@echo "make check-series  every patch has its header and the whole series applies cleanly"
	@echo "make dist          build the fork's wheel into dist/"
	@echo "make before-after  each fix's tests fail without its patch and pass with it"
	@echo "make bench         the graph benchmark (results/)"

$(VENV)/.installed-requirements: requirements/runtime.txt requirements/test.txt requirements/build.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade "pip>=24"
	$(PIP) install -r requirements/test.txt
	touch $@

venv: $(VENV)/.installed-requirements

fork:
	$(PYTHON) tools/fork.py materialize $(if $(UPTO),--upto $(UPTO))

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

dist: venv
	$(PYTHON) tools/fork.py materialize
	$(VPY) -m pip wheel --no-deps --no-build-isolation -q -w dist .
	@ls -1 dist/*.whl

test: install
	$(VPY) -m pytest -n $(WORKERS) -p no:cacheprovider tests

demo: install
	$(VPY) examples/train_xla.py

before-after: venv
	$(VPY) tools/before_after.py

# BENCH_ARGS: e.g. "--quick", "--rows xla-loop,fork --sizes small" (bench/graph_bench.py --help)
BENCH_ARGS ?=
bench: install
	$(PIP) install -r requirements/bench.txt
	$(VPY) bench/graph_bench.py $(BENCH_ARGS)

clean:
	rm -rf src build dist *.egg-info .fork-staging-*
