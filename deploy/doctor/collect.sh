#!/bin/sh
# Collect the doctor Jobs' logs and merge them into one report (exit 0 pass, 1 fail).
#   deploy/doctor/collect.sh [NAMESPACE] [-o json]
# Needs kubectl (context pointing at the cluster) and rdmaplane on this machine. Waits until
# every Job has completed or failed (a failed Job is a verdict too: its pod exited 1), at most
# 30 minutes, then reads every pod's log.
set -eu
ns="${1:-rdmaplane-doctor}"
[ $# -gt 0 ] && shift
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
unfinished() {
  kubectl -n "$ns" get jobs -l app=rdmaplane-doctor \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.status=="True")].type}{"\n"}{end}' |
    grep -cvE '(^| )(Complete|Failed)( |$)' || true
}
deadline=$(( $(date +%s) + 1800 ))
while [ "$(unfinished)" -gt 0 ]; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "collect.sh: some doctor Jobs in $ns still running after 30 min; reporting what ran" >&2
    break
  fi
  sleep 5
done
for pod in $(kubectl -n "$ns" get pods -l app=rdmaplane-doctor -o name); do
  kubectl -n "$ns" logs "$pod" > "$out/$(basename "$pod").log" 2>&1 || true
done
exec rdmaplane doctor report "$out"/*.log "$@"
