#!/usr/bin/env bash
# Check the TPU workflow's inputs against an allow-list and print the settings of the run as `key=value` lines
# (the workflow appends them to $GITHUB_OUTPUT). Anything else fails loudly, before any cloud credential is used.
#
# Env: ACCELERATOR_TYPE (default v5litepod-8), ZONE (default: the type's first zone).
#      `bash scripts/tpu_ci_config.sh --list` prints the allowed accelerator types and zones.
#
# Only single-host slices are allowed: scripts/tpu_vm_test.sh runs on worker 0 of the VM, so the other hosts
# of a multi-host slice would sit idle (and the tests would not see their chips). The runtime (software)
# version follows from the type, so it cannot be mismatched by hand.
set -euo pipefail

# type | runtime version | zones that offer it (the reaper, REAP_ZONES in the workflow, looks in all of them)
ALLOWED="
v5litepod-1 v2-alpha-tpuv5-lite us-west4-a us-central1-a us-south1-a us-west1-c
v5litepod-4 v2-alpha-tpuv5-lite us-west4-a us-central1-a us-south1-a us-west1-c
v5litepod-8 v2-alpha-tpuv5-lite us-west4-a us-central1-a us-south1-a us-west1-c
v4-8 tpu-ubuntu2204-base us-central2-b
"

fail() {
  echo "::error title=TPU workflow input::$1" >&2
  exit 1
}

if [ "${1:-}" = "--list" ]; then
  echo "$ALLOWED" | awk 'NF {print "type " $1; for (i = 3; i <= NF; i++) print "zone " $i}' | awk '!seen[$0]++'
  exit 0
fi

# shown in messages only with harmless characters (a value could try to smuggle in a workflow command)
shown() { printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '?'; }

type="${ACCELERATOR_TYPE:-v5litepod-8}"
line="$(echo "$ALLOWED" | awk -v t="$type" 'NF && $1 == t')"
if [ -z "$line" ]; then
  fail "accelerator type '$(shown "$type")' is not allowed; use one of: $(echo "$ALLOWED" | awk 'NF {printf "%s ", $1}')(single-host slices only)"
fi
runtime="$(echo "$line" | awk '{print $2}')"
zones="$(echo "$line" | cut -d' ' -f3-)"
zone="${ZONE:-${zones%% *}}"
case " $zones " in
  *" $zone "*) ;;
  *) fail "zone '$(shown "$zone")' does not offer '$type' here; use one of: $zones" ;;
esac

echo "accelerator_type=$type"
echo "runtime_version=$runtime"
echo "zone=$zone"
