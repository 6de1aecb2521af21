#!/usr/bin/env bash
# Evidence for the DDP fix: train examples/mnist_tpu_ddp.py with DDP on every TPU core of this host, once on
# the fork WITHOUT the DDP fix (upstream 1.8.6 + the compat patches up to `compat-pjrt-launchers-and-strategies`)
# and once on the full series, then plot both loss curves and the replica spread into build/evidence/ddp_loss.png.
#
#     bash scripts/ddp_evidence.sh            # on a TPU VM, after scripts/tpu_vm_test.sh (reuses .venv)
#     DEVICES=1 STEPS=5 bash scripts/ddp_evidence.sh   # a dry run on XLA:CPU (one replica: no spread)
#
# Env: STEPS (default 200), DEVICES (default auto), BEFORE_UPTO (default the last compat patch),
#      EXTRA_ARGS (passed to the example, e.g. "--synthetic"), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=build/evidence
STEPS="${STEPS:-200}"
DEVICES="${DEVICES:-auto}"
BEFORE_UPTO="${BEFORE_UPTO:-0003-compat-pjrt-launchers-and-strategies.patch}"

"$PY" tools/fork.py materialize --upto "$BEFORE_UPTO" --dest "$OUT/before/src"
"$PY" tools/fork.py materialize --dest "$OUT/after/src"

for which in before after; do
  echo "=== $which: $(cat "$OUT/$which/src/.fork-stamp.json" | tr -d '\n' | cut -c1-200)"
  rm -rf "$OUT/$which/run"
  # PYTHONPATH comes before site-packages: this tree wins over an installed fork
  # shellcheck disable=SC2086
  PYTHONPATH="$PWD/$OUT/$which/src" "$PY" examples/mnist_tpu_ddp.py --devices "$DEVICES" --max-steps "$STEPS" \
    --out "$OUT/$which/run" --data-dir build/data ${EXTRA_ARGS:-}
done

"$PY" scripts/plot_ddp_evidence.py "$OUT/before/run" "$OUT/after/run" --png "$OUT/ddp_loss.png" \
  --summary "$OUT/summary.md"
