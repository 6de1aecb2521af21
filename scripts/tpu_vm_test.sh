#!/usr/bin/env bash
# Run every `xla`- and `tpu`-marked test of this repository on a Cloud TPU VM, with PJRT_DEVICE=TPU.
#
# The same script serves the `tpu` workflow and a person on a TPU VM:
#     git clone <this repository> fork && cd fork && bash scripts/tpu_vm_test.sh
#
# It installs the fork the README's way (`make venv`, `make install`: a venv in .venv, the fork built from
# upstream 1.8.6 plus patches/1.8.6/series), adds the TPU runtime (libtpu, through torch_xla's `tpu` extra), and
# runs pytest once per test file: a TPU can be opened by one process at a time, so a test module that
# starts the runtime in the pytest process must not share that process with a test that spawns replicas.
# JUnit XML goes to build/tpu-results/ (one file per test module) plus a summary in build/tpu-results/summary.txt.
#
# Env: TEST_PATHS (default: tests), PYTEST_ARGS (extra pytest arguments), SKIP_INSTALL=1 (reuse .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
export PJRT_DEVICE=TPU
VPY="$REPO/.venv/bin/python"
OUT="$REPO/build/tpu-results"
TEST_PATHS="${TEST_PATHS:-tests}"

if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  # Ubuntu's python3 has no ensurepip unless python3-venv is installed
  if ! python3 -c "import ensurepip" >/dev/null 2>&1; then
    sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
  fi
  make venv PYTHON=python3
  # the TPU runtime for the pinned torch_xla (requirements/tpu.txt)
  "$VPY" -m pip --disable-pip-version-check -q install -r requirements/tpu.txt
  make install PYTHON="$VPY"
fi

"$VPY" - <<'PY'
import importlib.metadata as md
import pytorch_lightning, torch, torch_xla
from torch_xla._internal import tpu
print(f"fork {pytorch_lightning.__version__} from {pytorch_lightning.__file__}")
try:
    libtpu = md.version("libtpu")
except md.PackageNotFoundError:
    libtpu = "not installed"
print(f"torch {torch.__version__}, torch_xla {torch_xla.__version__}, libtpu {libtpu}")
chips = tpu.num_available_chips()
print(f"TPU chips on this host: {chips}")
if chips < 1:
    raise SystemExit("no TPU chip found: run this on a Cloud TPU VM")
PY

rm -rf "$OUT"
mkdir -p "$OUT"
# shellcheck disable=SC2086
"$VPY" -m pytest -p no:cacheprovider --collect-only -q -m "xla or tpu" $TEST_PATHS > "$OUT/collected.txt" || {
  cat "$OUT/collected.txt"
  echo "collection failed" >&2
  exit 1
}
mapfile -t FILES < <(grep '::' "$OUT/collected.txt" | sed 's/::.*//' | awk '!seen[$0]++')
if [ "${#FILES[@]}" -eq 0 ]; then
  echo "no test is marked xla or tpu under $TEST_PATHS" >&2
  exit 1
fi
echo "$(grep -c '::' "$OUT/collected.txt") tests in ${#FILES[@]} files are marked xla or tpu"

status=0
for file in "${FILES[@]}"; do
  name="$(echo "$file" | sed 's#[/.]#_#g')"
  echo "=== $file"
  # shellcheck disable=SC2086
  "$VPY" -m pytest -p no:cacheprovider -m "xla or tpu" -rs --junitxml="$OUT/junit-$name.xml" \
    ${PYTEST_ARGS:-} "$file" || status=1
done

# one line per module and a total; a run where nothing ran on the TPU is a failure, not a pass
"$VPY" - "$OUT" <<'PY' || status=1
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
lines = []
for xml in sorted(out.glob("junit-*.xml")):
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in total}
    for k in total:
        total[k] += counts[k]
    lines.append(f"{xml.name}: " + ", ".join(f"{counts[k]} {k}" for k in total))
lines.append("TOTAL: " + ", ".join(f"{total[k]} {k}" for k in total))
(out / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
if total["tests"] - total["skipped"] == 0:
    sys.exit("every xla/tpu test was skipped: the TPU was not used")
PY
exit "$status"
