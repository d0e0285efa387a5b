#!/usr/bin/env bash
# Builds the end-to-end test control plane (kube-apiserver, kube-scheduler,
# kube-controller-manager, etcd) from the upstream Go modules pinned in test/k8s/go.mod, once,
# into a cache folder keyed by versions:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/k8s/<key>/bin
# and two tools from their own modules (go install pkg@version): KWOK (fake nodes with a pod
# lifecycle) at $kwok_version and Helm (for the chart's tests) at $helm_version, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/{kwok,helm}/<tool key>/bin
# Later runs reuse all of them. Progress goes to stderr; the k8s bin dir is the one line on stdout.
#
#   scripts/build-k8s.sh                 build if needed, print the k8s bin dir
#   scripts/build-k8s.sh --bin-dir       print the k8s bin dir only (builds nothing)
#   scripts/build-k8s.sh --kwok-bin-dir  print the kwok bin dir only (builds nothing)
#   scripts/build-k8s.sh --helm-bin-dir  print the helm bin dir only (builds nothing)
#
#   scripts/build-k8s.sh kubelet-harness         build the admission harness if needed, print its path
#   scripts/build-k8s.sh kubelet-harness --path  print its path only (builds nothing)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# --- the kubelet admission harness (test/k8s/kubelet-harness): its own module, key and binary,
# so that building it never moves the e2e binaries' key below.
kubelet_harness() {
  local module="$root/test/k8s/kubelet-harness"
  local kube go_version hash key bin
  kube="$(awk '{ sub(/^require[ \t]+/, "") } $1 == "k8s.io/kubernetes" { print $2; exit }' "$module/go.mod")"
  go_version="$(go env GOVERSION)"
  hash="$(cat "$module"/go.mod "$module"/go.sum "$module"/*.go "$module"/*.s | sha256sum | cut -c1-10)"
  key="kubelet-harness_kube-${kube}_${go_version}_${hash}"
  bin="${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/k8s/$key/bin/kubelet-harness"
  if [[ "${1:-}" == "--path" || -x "$bin" ]]; then
    echo "$bin"
    return
  fi
  mkdir -p "$(dirname "$bin")"
  exec 8>"$(dirname "$bin")/build.lock"
  flock 8 # a parallel build of the same key waits here, then finds the binary
  if [[ ! -x "$bin" ]]; then
    local start=$SECONDS
    printf '[build-k8s %(%H:%M:%S)T] building kubelet-harness (device manager + Topology Manager %s)\n' -1 "$kube" >&2
    (cd "$module" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
      go build -trimpath -ldflags="-s -w" -o "$bin.partial" .)
    mv "$bin.partial" "$bin"
    printf '[build-k8s %(%H:%M:%S)T] built kubelet-harness in %d s\n' -1 $((SECONDS - start)) >&2
  fi
  echo "$bin"
}
if [[ "${1:-}" == "kubelet-harness" ]]; then
  kubelet_harness "${2:-}"
  exit 0
fi

module="$root/test/k8s"
binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd)

pinned() { awk -v m="$1" '{ sub(/^require[ \t]+/, "") } $1 == m { print $2; exit }' "$module/go.mod"; }
kube_version="$(pinned k8s.io/kubernetes)"
etcd_version="$(pinned go.etcd.io/etcd/server/v3)"
go_version="$(go env GOVERSION)"
# The hash changes whenever any dependency does, so a re-pin never reuses stale binaries.
deps_hash="$(cat "$module/go.mod" "$module/go.sum" "$module/cmd/etcd/main.go" | sha256sum | cut -c1-10)"
key="kube-${kube_version}_etcd-${etcd_version}_${go_version}_${deps_hash}"
bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/k8s/$key/bin"

# Tools that are their own Go module (go install pkg@version): each key holds only the tool's
# version and Go's. Helm stamps the Kubernetes minor its client libraries speak (v3.22 is built
# on 0.37) as its default for `helm template`, as helm's own Makefile does.
kwok_version=v0.8.0
kwok_bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/kwok/kwok-${kwok_version}_${go_version}/bin"
helm_version=v3.22.0
helm_k8s_minor=37
helm_bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/helm/helm-${helm_version}_${go_version}/bin"

case "${1:-}" in
  --bin-dir) echo "$bin_dir"; exit 0 ;;
  --kwok-bin-dir) echo "$kwok_bin_dir"; exit 0 ;;
  --helm-bin-dir) echo "$helm_bin_dir"; exit 0 ;;
esac

log() { printf '[build-k8s %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# build_tool NAME BIN_DIR PKG@VERSION LDFLAGS: `go install` once per key, under its own lock.
build_tool() {
  local name="$1" dir="$2" pkg="$3" ldflags="$4"
  [[ -x "$dir/$name" ]] && return 0
  mkdir -p "$(dirname "$dir")"
  (
    flock 8
    [[ -x "$dir/$name" ]] && exit 0
    log "building $pkg with $go_version (about 2 min on 2 cores, once)"
    local_start=$SECONDS
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    (cd / && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOBIN="$dir.partial" \
      go install -ldflags="-s -w $ldflags" "$pkg")
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    log "built $name in $((SECONDS - local_start)) s"
  ) 8>"$(dirname "$dir")/build.lock"
}
build_tool kwok "$kwok_bin_dir" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version" ""
helm_x="-X helm.sh/helm/v3/internal/version.version=$helm_version"
for pkg in pkg/chartutil pkg/lint/rules; do
  helm_x+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$helm_k8s_minor"
done
build_tool helm "$helm_bin_dir" "helm.sh/helm/v3/cmd/helm@$helm_version" "$helm_x"

complete() { for b in "${binaries[@]}"; do [[ -x "$bin_dir/$b" ]] || return 1; done; }
if complete; then
  echo "k8s test binaries: reusing $bin_dir" >&2
  echo "$bin_dir"
  exit 0
fi

mkdir -p "$(dirname "$bin_dir")"
exec 9>"$(dirname "$bin_dir")/build.lock"
flock 9 # a parallel build of the same key waits here, then finds the binaries
if complete; then
  echo "$bin_dir"
  exit 0
fi

staging="$bin_dir.partial"
rm -rf "$staging"
mkdir -p "$staging"
start=$SECONDS
cd "$module"
export CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false"
log "building kube-apiserver, kube-scheduler, kube-controller-manager $kube_version and etcd $etcd_version with $go_version"
log "(first build: expect tens of minutes on 2 cores; later runs reuse $bin_dir)"
log "downloading modules"
go mod download
version_pkg=k8s.io/component-base/version
minor="${kube_version#v1.}"
minor="${minor%%.*}"
ldflags="-s -w -X $version_pkg.gitVersion=$kube_version -X $version_pkg.gitMajor=1"
ldflags+=" -X $version_pkg.gitMinor=$minor -X $version_pkg.gitTreeState=clean"
for b in "${binaries[@]}"; do
  case "$b" in
    etcd) pkg=./cmd/etcd ;;
    *) pkg="k8s.io/kubernetes/cmd/$b" ;;
  esac
  log "building $b ($pkg)"
  go build -trimpath -ldflags="$ldflags" -o "$staging/$b" "$pkg"
  log "built $b ($(du -h "$staging/$b" | cut -f1), $((SECONDS - start)) s so far)"
done
rm -rf "$bin_dir"
mv "$staging" "$bin_dir"
log "done in $((SECONDS - start)) s"
echo "$bin_dir"
