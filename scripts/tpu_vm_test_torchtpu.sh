#!/usr/bin/env bash
# Run TorchTPU's tests (marker `tpu_standin`) on a Cloud TPU VM's real "tpu" device, with the real torch-tpu: the
# tests that run on the stand-in device in CI (tests/helpers/tpu_standin) run here without it (PL_TORCH_TPU_REAL=1).
#
#     git clone <this repository> fork && cd fork && bash scripts/tpu_vm_test_torchtpu.sh
#
# It builds .venv-torchtpu the README's way (`make venv STACK=torchtpu`, `make install STACK=torchtpu`: torch 2.14,
# torch-tpu and libtpu from requirements/torchtpu.txt). JUnit XML goes to build/tpu-results/torchtpu.xml.
# Env: PYTEST_ARGS (extra pytest arguments), SKIP_INSTALL=1 (reuse .venv-torchtpu).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  make venv STACK=torchtpu PYTHON=python3
  make install STACK=torchtpu
fi
mkdir -p build/tpu-results
# shellcheck disable=SC2086
PL_TORCH_TPU_REAL=1 .venv-torchtpu/bin/python -m pytest -m tpu_standin -p no:cacheprovider \
  --junitxml=build/tpu-results/torchtpu.xml ${PYTEST_ARGS:-} tests
