#!/usr/bin/env bash
# Delete the CI's TPU VM at the end of a run, whatever happened before. Never skips silently: a VM that does
# not exist (its creation failed) is said so; any other failure to describe or delete it fails the step with an
# error annotation, since the VM may still be running and billing (the scheduled reaper is the fallback).
#
# Env: VM_NAME, ZONE. Needs an authenticated `gcloud`.
set -uo pipefail

fail() {
  echo "::error title=TPU VM not deleted::$1" >&2
  exit 1
}

[ -n "${VM_NAME:-}" ] && [ -n "${ZONE:-}" ] || fail "VM_NAME and ZONE must be set"

if ! described="$(gcloud compute tpus tpu-vm describe "$VM_NAME" --zone="$ZONE" --format='value(state)' 2>&1)"; then
  if printf '%s' "$described" | grep -q 'NOT_FOUND'; then
    echo "$VM_NAME does not exist in $ZONE (it was never created): nothing to delete"
    exit 0
  fi
  fail "could not describe $VM_NAME in $ZONE, so it may still exist: $described"
fi
echo "deleting $VM_NAME in $ZONE (state: ${described:-unknown})"
if ! out="$(gcloud compute tpus tpu-vm delete "$VM_NAME" --zone="$ZONE" --quiet 2>&1)"; then
  fail "gcloud could not delete $VM_NAME in $ZONE: $out"
fi
printf '%s\n' "$out"
echo "deleted $VM_NAME"
