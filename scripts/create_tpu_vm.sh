#!/usr/bin/env bash
# Create the CI's spot TPU VM, running as a dedicated service account with minimal OAuth scopes, never as the
# project's default compute identity (which has broad rights in most projects): branch code runs on that VM.
#
# Env (all required but VM_SCOPES): VM_NAME, ZONE, ACCELERATOR_TYPE, RUNTIME_VERSION, VM_LABEL (key=value),
#   VM_SERVICE_ACCOUNT   the VM's own service account (workflow variable TPU_VM_SERVICE_ACCOUNT); give it no roles
#   VM_SCOPES            comma-separated OAuth scopes (workflow variable TPU_VM_SCOPES), default: logging.write only
# Needs an authenticated `gcloud`.
set -euo pipefail

fail() {
  echo "::error title=TPU VM::$1" >&2
  exit 1
}

for var in VM_NAME ZONE ACCELERATOR_TYPE RUNTIME_VERSION VM_LABEL; do
  [ -n "${!var:-}" ] || fail "$var is not set"
done
sa="${VM_SERVICE_ACCOUNT:-}"
scopes="${VM_SCOPES:-https://www.googleapis.com/auth/logging.write}"

if [ -z "$sa" ]; then
  fail "no service account for the VM: set the variable TPU_VM_SERVICE_ACCOUNT of the 'tpu' environment to a dedicated account (docs/tpu-vm.md); without it the VM would run as the project's default compute identity"
fi
case "$sa" in
  *-compute@developer.gserviceaccount.com)
    fail "TPU_VM_SERVICE_ACCOUNT is the project's default compute identity ($sa); create a dedicated account without roles (docs/tpu-vm.md)" ;;
  *@*.iam.gserviceaccount.com) ;;
  *) fail "TPU_VM_SERVICE_ACCOUNT '$sa' is not a service account address (<name>@<project>.iam.gserviceaccount.com)" ;;
esac
IFS=',' read -r -a scope_list <<< "$scopes"
for scope in "${scope_list[@]}"; do
  case "$scope" in
    https://www.googleapis.com/auth/cloud-platform | https://www.googleapis.com/auth/cloud-platform.read-only)
      fail "TPU_VM_SCOPES includes $scope, which reaches every API the account may use; list only what the VM needs (default: logging.write)" ;;
    https://www.googleapis.com/auth/*) ;;
    *) fail "TPU_VM_SCOPES: '$scope' is not an OAuth scope URL (https://www.googleapis.com/auth/...)" ;;
  esac
done

echo "creating $VM_NAME ($ACCELERATOR_TYPE, $RUNTIME_VERSION) in $ZONE as $sa with scopes $scopes"
gcloud compute tpus tpu-vm create "$VM_NAME" \
  --zone="$ZONE" \
  --accelerator-type="$ACCELERATOR_TYPE" \
  --version="$RUNTIME_VERSION" \
  --labels="${VM_LABEL},run=${GITHUB_RUN_ID:-local}" \
  --service-account="$sa" \
  --scopes="$scopes" \
  --spot
