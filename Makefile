# Lightning XLA fork. `make help` lists the targets.
PYTHON ?= python3
# STACK=xla (the default): torch 2.9 with torch_xla in .venv; STACK=torchtpu: torch 2.14 with torch-tpu in
# .venv-torchtpu (requirements/torchtpu.txt), where TorchTPU's tests run on the stand-in device (tests/helpers/tpu_standin)
STACK ?= xla
ifeq ($(STACK),torchtpu)
VENV ?= .venv-torchtpu
RUNTIME_REQUIREMENTS := requirements/torchtpu.txt
TEST_REQUIREMENTS := requirements/test-torchtpu.txt
# with torch-tpu installed and no chip, libtpu asks the GCE metadata server for a TPU at the first backward and waits
# minutes for an answer off Google Cloud (docs/torchtpu.md): a host without TPU chips tells it not to ask
ifeq ($(shell ls /dev/accel0 /dev/vfio/0 >/dev/null 2>&1 && echo TPU),)
export TPU_SKIP_MDS_QUERY := 1
endif
else ifeq ($(STACK),xla)
VENV ?= .venv
RUNTIME_REQUIREMENTS := requirements/runtime.txt
TEST_REQUIREMENTS := requirements/test.txt
else
$(error STACK=$(STACK): choose xla (torch_xla, the default) or torchtpu (torch-tpu))
endif
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

.PHONY: help venv fork check-series series-comments refresh restat new-patch install dist pr-series verify-2.6.6 \
	upstream-tests upstream-tests-xla upstream-tests-xla-check upstream-test-edits test test-matrix demo bench bench-graph figures check-figures pr-series-check bench-checkpoint bench-host bench-host-profile bench-device bench-spmd bench-llm before-after hooks \
	check-commits clean

# Variables: PATCH=<patch of patches/1.8.6/series> names the patch for refresh, restat and new-patch (a name or its
# number for refresh and restat; the new file's name for new-patch); UPTO=<patch> the end of a prefix of the series.
help:
	@echo "make demo          install everything, train the example on XLA (PJRT_DEVICE=$(PJRT_DEVICE)) and print per-step graph counts"
	@echo "make test          install everything and run the test suite (all but the full_matrix cells)"
	@echo "make test-matrix   the rest of the resume matrix: every checkpoint trigger x strategy x num_workers (CI runs it after make test)"
	@echo "make venv          create .venv with the pinned stack (after checking this Python can install it)"
	@echo "make install       materialize src/ and install the fork into .venv"
	@echo "make fork [UPTO=N] [FORCE=1]  materialize upstream 1.8.6 + patches/1.8.6/series (or up to patch N) into src/"
	@echo "make refresh PATCH=NAME   rewrite patch NAME from edits in src/ (src/ must hold the series up to NAME)"
	@echo "make restat PATCH=NAME    redraw patch NAME's diffstat after its tests/ sections were edited by hand"
	@echo "make new-patch PATCH=0046-name.patch SUBJECT=... BODY=file KIND=compat|fix|feature FORWARDED=no|not-needed|URL [BUG=url] [ORIGIN=vendor]"
	@echo "make check-series  both queues (patches/1.8.6, patches/2.6.6): the header rules, the series files' comment lines, the README's generated blocks, and that each series applies"
	@echo "make series-comments  rewrite the series files' comment lines from the patch headers"
	@echo "make dist          build the fork's wheels (pytorch-lightning, lightning-lite, lightning) into dist/"
	@echo "make pr-series-check  the 1.8.6 fixes applied with git am on upstream's tag, their tests under upstream's configuration (results/pr-series-1.8.6.json; UPSTREAM=<clone>)"
	@echo "make pr-series     both upstream series as mbox patches (build/pr-series/ for 1.8.6, build/pr-series-2.6.6/) and docs/upstream-prs.md"
	@echo "make verify-2.6.6  each patches/2.6.6 patch's tests fail on Lightning 2.6.6 without it and pass with it (patches/2.6.6/verified.json)"
	@echo "make before-after  each 1.8.6 fix's tests fail without its patch and pass with it"
	@echo "make upstream-tests UPSTREAM=DIR  upstream's own 1.8.6 tests (a clone of upstream in DIR) on the compat patches alone and on the series, compared"
	@echo "make upstream-tests-xla UPSTREAM=DIR  the same on one XLA device (Trainer and Lite), compared; writes the compat tree's baseline"
	@echo "make upstream-tests-xla-check UPSTREAM=DIR  the series alone on XLA against that committed baseline (CI): fails on a new difference"
	@echo "make upstream-test-edits UPSTREAM=DIR  each edit of upstream's tests: its tests fail on the series without it, pass with it (CI)"
	@echo "make figures       every result under results/ measured again on the current series (FIGURES=..., FIGURES_ARGS=--stale|--every-stop), pages rewritten, times said"
	@echo "make check-figures the results that are not the current series' own, each with the command that measures it again"
	@echo "make bench         the graph, host CPU, device-bound and checkpoint benchmarks (results/)"
	@echo "make bench-graph   the graph benchmark alone: counts and times of every row (results/bench.md)"
	@echo "make bench-checkpoint  what a save costs the training thread on XLA: synchronous against background writes (results/checkpoint.md)"
	@echo "make bench-host    host CPU per step: fork, Lightning 2.6.6, Lite, hand loop, in lock-stepped pairs (results/host.md)"
	@echo "make bench-host-profile  where the host CPU of a step goes, section by section: fork Trainer, Lite, Lightning 2.6.6 (results/host-profile.md)"
	@echo "make bench-device  wall time per step on a device-bound MLP: fork against torch_xla's idiom and Lightning 2.6.6, interleaved rounds (results/device.md)"
	@echo "make bench-spmd    the SPMD benchmark on 4 XLA:CPU devices or all TPU chips (results/spmd.md)"
	@echo "make bench-llm     a Llama-style decoder under FSDPv2: the fork's Trainer, pytorch/xla's recipe and the HF Trainer, f32 and bf16-mixed, with and without activation checkpointing (results/llm.md)"
	@echo "make hooks         install the commit-msg hook: each commit message is checked against docs/maintaining.md's rule"
	@echo "make check-commits [SINCE=origin/main]  the commit message rule on the commits since SINCE (none checked without it)"
	@echo "make clean         remove src/, build/, dist/ and the staging folders and locks of materialize"

# the interpreter check runs before anything is created or downloaded (tools/check_python.py: the Pythons and the
# platform with wheels of the pinned torch and torch_xla, from requirements/runtime.txt)
$(VENV)/.installed-requirements: $(RUNTIME_REQUIREMENTS) $(TEST_REQUIREMENTS) requirements/test-tools.txt requirements/build.txt
	@$(PYTHON) tools/check_python.py $(RUNTIME_REQUIREMENTS)
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	@$(VPY) tools/check_python.py $(RUNTIME_REQUIREMENTS)
	$(PIP) install --upgrade "pip>=24"
	$(PIP) install -r $(TEST_REQUIREMENTS)
	touch $@

venv: $(VENV)/.installed-requirements

fork:
	$(PYTHON) tools/fork.py materialize $(if $(UPTO),--upto $(UPTO)) $(if $(FORCE),--force)

check-series:
	$(PYTHON) tools/fork.py check

series-comments:
	$(PYTHON) tools/fork.py series-comments --write

refresh:
	@test -n "$(PATCH)" || { echo "make refresh PATCH=<patch name or number>"; exit 2; }
	$(PYTHON) tools/fork.py refresh $(PATCH)

restat:
	@test -n "$(PATCH)" || { echo "make restat PATCH=<patch name or number>"; exit 2; }
	$(PYTHON) tools/fork.py restat $(PATCH)

SUBJECT ?=
BODY ?=
KIND ?=
FORWARDED ?=
BUG ?=
ORIGIN ?= vendor
new-patch:
	@test -n "$(PATCH)" || { echo "make new-patch PATCH=<NNNN-name.patch> SUBJECT=... BODY=<file> KIND=... FORWARDED=..."; exit 2; }
	$(PYTHON) tools/fork.py new $(PATCH) --subject "$(SUBJECT)" --body-file "$(BODY)" --kind "$(KIND)" --forwarded "$(FORWARDED)" --origin "$(ORIGIN)" $(if $(BUG),--bug "$(BUG)")

# the installed (non-editable) fork is what the tests and the demo import
install: venv
	$(PYTHON) tools/fork.py materialize
	$(PIP) install --no-deps --no-build-isolation --force-reinstall .

# three wheels from the one series: pytorch-lightning (setup.py), lightning-lite and the unified lightning
# (`fork.py unified`; lightning.app comes unchanged from the pinned upstream lightning wheel)
dist: venv
	$(PYTHON) tools/fork.py materialize
	rm -f dist/pytorch_lightning-*.whl dist/lightning_lite-*.whl dist/lightning-*.whl
	$(VPY) -m pip wheel --no-deps --no-build-isolation -q -w dist .
	$(VPY) tools/fork.py unified wheels --src src --dist dist
	@ls -1 dist/*.whl

# the fixes (Kind: fix) as a git am series for upstream's tag 1.8.6, the fixes for Lightning 2.6.6 (patches/2.6.6/)
# as one pull request each against its source layout, and docs/upstream-prs.md for both
pr-series:
	$(PYTHON) tools/fork.py pr-series export --out build/pr-series --doc docs/upstream-prs.md
	$(PYTHON) tools/fork.py pr-series-266 export --out build/pr-series-2.6.6

test: install
	$(VPY) -m pytest -n $(WORKERS) --dist worksteal -p no:cacheprovider -m "not full_matrix" tests

# the cells of the resume matrix (tests/tests_pytorch/checkpointing/test_xla_exact_resume.py) that `make test` leaves
# out to stay within 15 minutes on 2 cores: about 5 minutes more
test-matrix: install
	$(VPY) -m pytest -n $(WORKERS) --dist worksteal -p no:cacheprovider -m full_matrix tests

demo: install
	$(VPY) examples/train_xla.py

before-after: venv
	$(VPY) tools/fork.py before-after

# upstream's own 1.8.6 tests (tests/ of tag 1.8.6 in UPSTREAM: a clone of Lightning-AI/lightning, or its .git) on the
# compat patches alone and on the whole series, with PJRT_DEVICE unset; results/upstream-tests-1.8.6.json
UPSTREAM ?=
# e.g. "--workers 2 --reruns 3" (what CI runs: both trees in about 7 minutes on 2 cores)
UPSTREAM_CPU_ARGS ?=
# on the TorchTPU stack (STACK=torchtpu) the same comparison runs on torch 2.14 as a CPU user has it, without torch-tpu
# (its loader off: with no chip it only adds libtpu's start-up, tested on its own in test_torch_tpu.py), and has its
# own result and build folder
UPSTREAM_CPU_OUT := $(if $(filter torchtpu,$(STACK)),--out results/upstream-tests-1.8.6-torchtpu.json --build build/upstream-tests-torchtpu)
UPSTREAM_CPU_ENV := $(if $(filter torchtpu,$(STACK)),TORCH_DEVICE_BACKEND_AUTOLOAD=0)
upstream-tests: venv
	@test -n "$(UPSTREAM)" || { echo "make upstream-tests UPSTREAM=<a clone of Lightning-AI/lightning with tag 1.8.6>"; exit 2; }
	env -u PJRT_DEVICE $(UPSTREAM_CPU_ENV) $(VPY) tools/fork.py upstream-tests run --upstream $(UPSTREAM) $(UPSTREAM_CPU_OUT) $(UPSTREAM_CPU_ARGS)

# the same tests on one XLA device (PJRT_DEVICE, XLA:CPU here): the Trainer through upstream's own PL_TRAINER_*
# defaults, LightningLite through the fork's pytest plugin; results/upstream-tests-xla-1.8.6.json, and the compat
# tree's outcomes as the baseline that upstream-tests-xla-check (CI) compares the series with
UPSTREAM_XLA_ARGS ?= --workers $(WORKERS) --test-timeout 300
upstream-tests-xla: venv
	@test -n "$(UPSTREAM)" || { echo "make upstream-tests-xla UPSTREAM=<a clone of Lightning-AI/lightning with tag 1.8.6>"; exit 2; }
	$(VPY) tools/fork.py upstream-tests run --xla --upstream $(UPSTREAM) $(UPSTREAM_XLA_ARGS)

upstream-tests-xla-check: venv
	@test -n "$(UPSTREAM)" || { echo "make upstream-tests-xla-check UPSTREAM=<a clone of Lightning-AI/lightning with tag 1.8.6>"; exit 2; }
	$(VPY) tools/fork.py upstream-tests check --upstream $(UPSTREAM) $(UPSTREAM_XLA_ARGS) --reruns 3

# each edit the series makes to upstream's tests: its tests fail on the series without it and pass with it, on the CPU
# and on one XLA device; results/upstream-test-edits-1.8.6.json
upstream-test-edits: venv
	@test -n "$(UPSTREAM)" || { echo "make upstream-test-edits UPSTREAM=<a clone of Lightning-AI/lightning with tag 1.8.6>"; exit 2; }
	$(VPY) tools/fork.py upstream-tests edits --upstream $(UPSTREAM) --workers $(WORKERS)

# the Lightning 2.6.6 series (patches/2.6.6/): each patch's tests fail on 2.6.6 without it and pass with it, on XLA:CPU
verify-2.6.6: venv
	$(VPY) tools/fork.py pr-series-266 verify

# BENCH_ARGS: e.g. "--quick", "--rows xla-loop,fork --sizes small" (python -m bench.graph_bench --help)
BENCH_ARGS ?=
bench: install
	$(PIP) install -r requirements/bench.txt
	$(VPY) -m bench.graph_bench $(BENCH_ARGS)
	$(VPY) -m bench.host_bench $(HOST_BENCH_ARGS)
	$(VPY) -m bench.device_bench $(DEVICE_BENCH_ARGS)
	$(VPY) -m bench.checkpoint_bench $(CHECKPOINT_BENCH_ARGS)
	$(PYTHON) tools/fork.py readme-bench

# the graph benchmark only (results/bench.md): counts and times of every row (upstream, each fix, the fork, 2.6.6, loops)
bench-graph: install
	$(PIP) install -r requirements/bench.txt
	$(VPY) -m bench.graph_bench $(BENCH_ARGS)
	$(PYTHON) tools/fork.py readme-bench

# every result under results/ measured again on the current series, the pages that quote them rewritten, the time
# each took said; FIGURES: some of them ("checkpoint host"), FIGURES_ARGS: "--stale" or "--every-stop"
FIGURES ?=
FIGURES_ARGS ?=
figures: install
	UPSTREAM="$(or $(UPSTREAM),/work/.mirror/Lightning-AI+lightning/repo)" $(VPY) tools/fork.py figures run $(FIGURES_ARGS) $(FIGURES)

# the results under results/ that are not the current series' own, each with the command that measures it again
check-figures:
	$(PYTHON) tools/fork.py figures check

# the 1.8.6 fixes applied with git am on upstream's own tag, their tests run under upstream's configuration
# (results/pr-series-1.8.6.json); docs/upstream-prs.md is written again to quote that run
pr-series-check: venv pr-series
	@test -n "$(UPSTREAM)" || { echo "make pr-series-check UPSTREAM=<a clone of Lightning-AI/lightning with tag 1.8.6>"; exit 2; }
	$(VPY) tools/fork.py pr-series check-tag --upstream-git $(UPSTREAM); status=$$?; \
	$(PYTHON) tools/fork.py pr-series export --out build/pr-series --doc docs/upstream-prs.md && exit $$status

# host CPU per step only (results/host.md): the fork, Lightning 2.6.6, Lite and the hand loop in lock-stepped pairs
bench-host: install
	$(VPY) -m bench.host_bench $(HOST_BENCH_ARGS)
	$(PYTHON) tools/fork.py readme-bench

# the host CPU of a step by section (results/host-profile.md): what host_bench.py measures, taken apart
bench-host-profile: install
	$(VPY) -m bench.host_profile

# wall time per step on a device-bound MLP (results/device.md): the fork's Trainer against torch_xla's idiom and
# Lightning 2.6.6, every row in a fresh process, in interleaved rounds, then the host-work sweep (host ms per step);
# DEVICE_BENCH_ARGS: e.g. "--quick", "--rounds 7", "--sweep 0,20"
DEVICE_BENCH_ARGS ?= --sweep 0,20,40,80
bench-device: install
	$(PIP) install -r requirements/bench.txt
	$(VPY) -m bench.device_bench $(DEVICE_BENCH_ARGS)
	$(PYTHON) tools/fork.py readme-bench

# one process drives every XLA device: CPU_NUM_DEVICES of them on XLA:CPU, every chip of the host on a TPU VM
CPU_NUM_DEVICES ?= 4
# what a checkpoint costs the training thread on XLA (results/checkpoint.md): synchronous writes against the fork's
# writes in the background, a ~500 MB state (MLP with Adam), rows interleaved in rounds
bench-checkpoint: install
	$(VPY) -m bench.checkpoint_bench $(CHECKPOINT_BENCH_ARGS)

bench-spmd: install
	CPU_NUM_DEVICES=$(CPU_NUM_DEVICES) $(VPY) -m bench.spmd_bench $(BENCH_ARGS)

# examples/llama_xla.py's model at --size bench on CPU_NUM_DEVICES devices (results/llm.md): the fork's Trainer against
# pytorch/xla's FSDPv2 recipe and the HF Trainer, interleaved rounds; LLM_BENCH_ARGS: e.g. "--rounds 1 --rows fork,recipe"
LLM_BENCH_ARGS ?=
bench-llm: install
	$(PIP) install -r requirements/bench.txt
	CPU_NUM_DEVICES=$(CPU_NUM_DEVICES) $(VPY) -m bench.llm_bench $(LLM_BENCH_ARGS)

# the commit message rule of docs/maintaining.md (tools/forkq/commitmsg.py): as each commit is written (the hook), and
# on the commits a branch adds (CI); a SINCE that names no commit here checks nothing and says so
SINCE ?= origin/main
hooks:
	$(PYTHON) tools/fork.py hooks

check-commits:
	$(PYTHON) tools/fork.py commit-msg --since "$(SINCE)"

clean:
	rm -rf src build dist *.egg-info .fork-staging-* .fork-*.lock
