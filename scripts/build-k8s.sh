#!/usr/bin/env bash
# Builds the end-to-end test control plane (kube-apiserver, kube-scheduler,
# kube-controller-manager, etcd) from the upstream Go modules pinned in upstream/go.mod, once,
# into a cache folder keyed by versions:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/k8s/<key>/bin
# and two tools from their own modules (go install pkg@version): KWOK (fake nodes with a pod
# lifecycle) at $kwok_version and Helm (for the chart's tests) at $helm_version, into
#   ${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane/{kwok,helm}/<tool key>/bin
# and, on request, the admission harness of tests/kubelet, the DRA allocator harness of
# tests/dra_allocator and the node of tests/node (the kubelet from upstream/node, containerd v2
# and CNI plugins) under .../rdmaplane/{k8s,node}/<key>.
# Later runs reuse all of them. Progress goes to stderr; the k8s bin dir is the one line on stdout.
#
#   scripts/build-k8s.sh                 build if needed, print the k8s bin dir
#   scripts/build-k8s.sh --bin-dir       print the k8s bin dir only (builds nothing)
#   scripts/build-k8s.sh --kwok-bin-dir  print the kwok bin dir only (builds nothing)
#   scripts/build-k8s.sh --helm-bin-dir  print the helm bin dir only (builds nothing)
#
#   scripts/build-k8s.sh kubelet-harness         build the admission harness if needed, print its path
#   scripts/build-k8s.sh kubelet-harness --path  print its path only (builds nothing)
#
#   scripts/build-k8s.sh dra-allocator           build the DRA allocator harness of tests/dra_allocator
#                                                if needed, print its path
#   scripts/build-k8s.sh dra-allocator --path    print its path only (builds nothing)
#
#   scripts/build-k8s.sh node            build the node of tests/node if needed, print its bin dir
#   scripts/build-k8s.sh node --bin-dir  print that bin dir only (builds nothing)
#
#   scripts/build-k8s.sh trim            remove Go's caches of these builds (`make k8s-bins` does,
#                                        once every binary is built)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/rdmaplane"
log() { printf '[build-k8s %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
# Go's build and module caches for these builds are ours, apart from the user's: ~7 GB after a
# cold build that only a rebuild would use, and that a shared CI disk cannot spare for the tests.
gocache="$cache/go"
export GOCACHE="$gocache/build" GOMODCACHE="$gocache/mod"
if [[ "${1:-}" == "trim" ]]; then
  if [[ -d "$gocache" ]]; then
    size="$(du -sh "$gocache" | cut -f1)"
    go clean -modcache # its files are read-only
    rm -rf "$gocache"
    log "removed Go's caches of these builds ($size; the binaries stay)"
  fi
  exit 0
fi
# pinned MODULE_DIR MODULE: the version a go.mod requires of MODULE.
pinned() { awk -v m="$2" '{ sub(/^require[ \t]+/, "") } $1 == m { print $2; exit }' "$1/go.mod"; }
# The version stamp upstream's own build gives every Kubernetes binary.
kube_ldflags() {
  local version_pkg=k8s.io/component-base/version minor="${1#v1.}"
  minor="${minor%%.*}"
  echo "-s -w -X $version_pkg.gitVersion=$1 -X $version_pkg.gitMajor=1 -X $version_pkg.gitMinor=$minor -X $version_pkg.gitTreeState=clean"
}

# --- the kubelet admission harness (upstream/kubelet-harness): its own module, key and binary,
# so that building it never moves the e2e binaries' key below.
kubelet_harness() {
  local module="$root/upstream/kubelet-harness"
  local kube go_version hash key bin
  kube="$(awk '{ sub(/^require[ \t]+/, "") } $1 == "k8s.io/kubernetes" { print $2; exit }' "$module/go.mod")"
  go_version="$(go env GOVERSION)"
  hash="$(cat "$module"/go.mod "$module"/go.sum "$module"/*.go "$module"/*.s | sha256sum | cut -c1-10)"
  key="kubelet-harness_kube-${kube}_${go_version}_${hash}"
  bin="$cache/k8s/$key/bin/kubelet-harness"
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

# --- the DRA allocator harness (upstream/dra-allocator): upstream's structured allocator, as
# kube-scheduler's DRA plugin runs it; its own module, key and binary, like the kubelet harness.
dra_allocator() {
  local module="$root/upstream/dra-allocator"
  local dra go_version hash key bin
  dra="$(pinned "$module" k8s.io/dynamic-resource-allocation)"
  go_version="$(go env GOVERSION)"
  hash="$(cat "$module"/go.mod "$module"/go.sum "$module"/*.go | sha256sum | cut -c1-10)"
  key="dra-allocator_dra-${dra}_${go_version}_${hash}"
  bin="$cache/k8s/$key/bin/dra-allocator"
  if [[ "${1:-}" == "--path" || -x "$bin" ]]; then
    echo "$bin"
    return
  fi
  mkdir -p "$(dirname "$bin")"
  exec 6>"$(dirname "$bin")/build.lock"
  flock 6 # a parallel build of the same key waits here, then finds the binary
  if [[ ! -x "$bin" ]]; then
    local start=$SECONDS
    printf '[build-k8s %(%H:%M:%S)T] building dra-allocator (k8s.io/dynamic-resource-allocation %s)\n' -1 "$dra" >&2
    (cd "$module" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
      go build -trimpath -ldflags="-s -w" -o "$bin.partial" .)
    mv "$bin.partial" "$bin"
    printf '[build-k8s %(%H:%M:%S)T] built dra-allocator in %d s\n' -1 $((SECONDS - start)) >&2
  fi
  echo "$bin"
}
if [[ "${1:-}" == "dra-allocator" ]]; then
  dra_allocator "${2:-}"
  exit 0
fi

# --- the node of tests/node, in one folder: the kubelet from upstream/node (its own module, the
# same k8s.io/kubernetes release as the control plane, so the control plane's key stays put),
# containerd v2 with its runc shim and ctr (Debian's containerd 1.6 has no CDI), and the CNI
# plugins the node's pod network uses; each tool with `go install pkg@version`.
containerd_version=v2.4.2
cni_version=v1.9.1
node_bins=(kubelet containerd containerd-shim-runc-v2 ctr bridge host-local loopback)
node() {
  local module="$root/upstream/node"
  local kube go_version hash key dir
  kube="$(pinned "$module" k8s.io/kubernetes)"
  go_version="$(go env GOVERSION)"
  hash="$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -c1-10)"
  key="kube-${kube}_containerd-${containerd_version}_cni-${cni_version}_${go_version}_${hash}"
  dir="$cache/node/$key/bin"
  node_complete() { for b in "${node_bins[@]}"; do [[ -x "$dir/$b" ]] || return 1; done; }
  if [[ "${1:-}" == "--bin-dir" ]] || node_complete; then
    echo "$dir"
    return
  fi
  mkdir -p "$(dirname "$dir")"
  exec 7>"$(dirname "$dir")/build.lock"
  flock 7 # a parallel build of the same key waits here, then finds the binaries
  if ! node_complete; then
    local start=$SECONDS containerd=github.com/containerd/containerd/v2 cni
    cni=github.com/containernetworking/plugins/plugins
    log "building the kubelet $kube, containerd $containerd_version and CNI plugins $cni_version"
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"
    (cd "$module" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -buildvcs=false" \
      go build -trimpath -ldflags="$(kube_ldflags "$kube")" -o "$dir.partial/kubelet" \
      k8s.io/kubernetes/cmd/kubelet)
    log "built the kubelet in $((SECONDS - start)) s"
    (cd / && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOBIN="$dir.partial" go install \
      -ldflags="-s -w -X $containerd/version.Version=$containerd_version" \
      "$containerd/cmd/containerd@$containerd_version" \
      "$containerd/cmd/containerd-shim-runc-v2@$containerd_version" \
      "$containerd/cmd/ctr@$containerd_version")
    (cd / && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOBIN="$dir.partial" go install \
      -ldflags="-s -w" "$cni/main/bridge@$cni_version" "$cni/ipam/host-local@$cni_version" \
      "$cni/main/loopback@$cni_version")
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    log "built the node in $((SECONDS - start)) s"
  fi
  echo "$dir"
}
if [[ "${1:-}" == "node" ]]; then
  node "${2:-}"
  exit 0
fi

module="$root/upstream"
binaries=(kube-apiserver kube-scheduler kube-controller-manager etcd)

kube_version="$(pinned "$module" k8s.io/kubernetes)"
etcd_version="$(pinned "$module" go.etcd.io/etcd/server/v3)"
go_version="$(go env GOVERSION)"
# The hash changes whenever any dependency does, so a re-pin never reuses stale binaries.
deps_hash="$(cat "$module/go.mod" "$module/go.sum" "$module/cmd/etcd/main.go" | sha256sum | cut -c1-10)"
key="kube-${kube_version}_etcd-${etcd_version}_${go_version}_${deps_hash}"
bin_dir="$cache/k8s/$key/bin"

# Tools that are their own Go module (go install pkg@version): each key holds only the tool's
# version and Go's. Helm stamps the Kubernetes minor its client libraries speak (v3.22 is built
# on 0.37) as its default for `helm template`, as helm's own Makefile does.
kwok_version=v0.8.0
kwok_bin_dir="$cache/kwok/kwok-${kwok_version}_${go_version}/bin"
helm_version=v3.22.0
helm_k8s_minor=37
helm_bin_dir="$cache/helm/helm-${helm_version}_${go_version}/bin"

case "${1:-}" in
  --bin-dir) echo "$bin_dir"; exit 0 ;;
  --kwok-bin-dir) echo "$kwok_bin_dir"; exit 0 ;;
  --helm-bin-dir) echo "$helm_bin_dir"; exit 0 ;;
esac

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
ldflags="$(kube_ldflags "$kube_version")"
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
