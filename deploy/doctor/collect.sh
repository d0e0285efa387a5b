#!/bin/sh
# Collect the doctor Jobs' logs and merge them into one report (exit 0 pass, 1 fail).
#   deploy/doctor/collect.sh [NAMESPACE] [-o json]
# Needs kubectl (context pointing at the cluster) and rdmaplane on this machine.
set -eu
ns="${1:-rdmaplane-doctor}"
[ $# -gt 0 ] && shift
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
kubectl -n "$ns" wait --for=condition=complete --timeout=30m job -l app=rdmaplane-doctor || true
for pod in $(kubectl -n "$ns" get pods -l app=rdmaplane-doctor -o name); do
  kubectl -n "$ns" logs "$pod" > "$out/$(basename "$pod").log" 2>&1 || true
done
exec rdmaplane doctor report "$out"/*.log "$@"
