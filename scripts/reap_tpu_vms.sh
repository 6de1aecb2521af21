#!/usr/bin/env bash
# Delete Cloud TPU VMs that this project's CI created and that are older than MAX_AGE_HOURS.
# A cancelled workflow run can skip its own cleanup step; this catches what it leaves behind. The `tpu` workflow
# runs it on a schedule. Nothing fails quietly: a zone that cannot be listed or a VM that cannot be deleted is
# reported as an error annotation and makes the script exit 1 (after it tried every zone and every VM).
#
# Env: VM_LABEL (key=value the CI puts on its VMs, default purpose=lightning-xla-ci),
#      MAX_AGE_HOURS (default 6), ZONE and REAP_ZONES (zones to look in), DRY_RUN=1 to only print.
# Needs an authenticated `gcloud` (the workflow provides one) and python3.
set -euo pipefail

VM_LABEL="${VM_LABEL:-purpose=lightning-xla-ci}"
MAX_AGE_HOURS="${MAX_AGE_HOURS:-6}"
ZONES="$(printf '%s\n' ${ZONE:-} ${REAP_ZONES:-} | awk 'NF && !seen[$0]++')"
if [ -z "$ZONES" ]; then
  echo "reap: set ZONE or REAP_ZONES" >&2
  exit 2
fi
case "$VM_LABEL" in
  *=*) ;;
  *) echo "reap: VM_LABEL must be key=value, not '$VM_LABEL'" >&2; exit 2 ;;
esac
label_key="${VM_LABEL%%=*}"
label_value="${VM_LABEL#*=}"

status=0
for zone in $ZONES; do
  if ! listing="$(gcloud compute tpus tpu-vm list --zone="$zone" --format=json)"; then
    echo "::error title=TPU reaper::could not list the TPU VMs in $zone; stale CI VMs there may still be running" >&2
    status=1
    continue
  fi
  # the selection is done in Python: exact label match, createTime older than the cutoff
  if ! stale="$(LISTING="$listing" LABEL_KEY="$label_key" LABEL_VALUE="$label_value" MAX_AGE_HOURS="$MAX_AGE_HOURS" \
    python3 - <<'PY'
import datetime as dt
import json
import os
import sys

nodes = json.loads(os.environ["LISTING"] or "[]")
cutoff = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=float(os.environ["MAX_AGE_HOURS"]))
for node in nodes:
    if (node.get("labels") or {}).get(os.environ["LABEL_KEY"]) != os.environ["LABEL_VALUE"]:
        continue
    created = node.get("createTime")
    if not created:
        print(f"::warning title=TPU reaper::{node.get('name')} has no createTime, so its age is unknown; not deleted",
              file=sys.stderr)
        continue
    # RFC 3339 with a Z suffix and up to nanoseconds: keep microseconds at most
    stamp = created.replace("Z", "+00:00")
    if "." in stamp:
        head, rest = stamp.split(".", 1)
        frac, _, tz = rest.partition("+")
        stamp = f"{head}.{frac[:6]}+{tz}"
    if dt.datetime.fromisoformat(stamp) < cutoff:
        print(node["name"].rsplit("/", 1)[-1])
PY
  )"; then
    echo "::error title=TPU reaper::could not read the listing of $zone (see above); nothing there was deleted" >&2
    status=1
    continue
  fi
  if [ -z "$stale" ]; then
    echo "reap: no CI TPU VM older than ${MAX_AGE_HOURS} h in $zone"
  fi
  for name in $stale; do
    echo "reap: deleting $name in $zone (older than ${MAX_AGE_HOURS} h, label $VM_LABEL)"
    if [ "${DRY_RUN:-0}" = "1" ]; then
      continue
    fi
    # synchronous, so that a deletion that fails is seen here and not lost in a background operation
    if ! gcloud compute tpus tpu-vm delete "$name" --zone="$zone" --quiet; then
      echo "::error title=TPU reaper::could not delete $name in $zone; it is still running and billing" >&2
      status=1
    fi
  done
done
exit "$status"
