#!/usr/bin/env bash
# Builds the control-plane binaries the integration tests and the demo run
# (kube-apiserver, etcd, and csrsigner: kube-controller-manager's CSR signing
# controller alone, ./cmd/csrsigner) from the versions pinned in this module,
# into a cache directory outside the repository, once. The public envtest
# binary download is not reachable here, so they come from source. A binary
# the directory lacks, or whose stamp is not this tree's (below), is built,
# the others kept.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:?usage: build.sh OUTPUT_DIR}"
(umask 077 && mkdir -p "$dir")

declare -A pkgs=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [csrsigner]=./cmd/csrsigner
  [etcd]=go.etcd.io/etcd/server/v3
)

# kube-apiserver and csrsigner report the version the release
# build stamps (hack/lib/version.sh); built from the module they would say
# v0.0.0-master, which Helm then compares with the chart's kubeVersion
# (>=1.30.0-0) and refuses. A binary built before it was stamped is rebuilt
# (a link only, with Go's build cache warm).
k8s_version="$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
k8s_minor="${k8s_version#v*.}"; k8s_minor="${k8s_minor%%.*}"
k8s_major="${k8s_version#v}"; k8s_major="${k8s_major%%.*}"
k8s_ldflags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=$k8s_major -X $p.gitMinor=$k8s_minor -X $p.gitTreeState=clean"
done

# A cached binary is taken only if it is what this tree builds: each has a
# stamp beside it, the digest of what builds it (this module's go.mod and
# go.sum, this script and with it the build command, csrsigner's own sources
# for csrsigner, the Go version, the target and the flags as go env reads
# them) and of the binary itself. A module bumped, csrsigner edited, or a
# binary replaced in the cache is built again (with Go's build cache warm, a
# link); the version a binary prints is its own word, not a check. Each
# binary's key is its own, so that editing csrsigner does not relink
# kube-apiserver.
if [[ -n "$(find -H "$dir" -maxdepth 0 -perm -002)" ]]; then
  echo "envtest-assets: $dir is writable by everyone: its binaries are run by the tests; chmod o-w it" >&2
  exit 1
fi
common_key="$(cd "$here" && { cat go.mod go.sum build.sh; go version; go env GOOS GOARCH GOAMD64 GOARM64 GOEXPERIMENT GOFLAGS CGO_ENABLED GOWORK; })"
stamp_of() {
  local key="$common_key"
  [[ "$1" != csrsigner ]] || key+="$(cd "$here" && cat cmd/csrsigner/*.go)"
  echo "$(printf '%s' "$key" | sha256sum | cut -d' ' -f1) $(sha256sum < "$dir/$1" | cut -d' ' -f1)"
}
missing=()
for bin in kube-apiserver csrsigner etcd; do
  if [[ ! -x "$dir/$bin" || ! -f "$dir/.$bin.stamp" || "$(cat "$dir/.$bin.stamp")" != "$(stamp_of "$bin")" ]]; then
    missing+=("$bin")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "envtest-assets: up to date in $dir"
  exit 0
fi

echo "envtest-assets: building ${missing[*]} into $dir"
echo "envtest-assets: a cold build takes about 16 CPU-minutes (8 minutes on two cores); later runs reuse it"
start=$SECONDS
cd "$here"
tmp=""
trap 'rm -f "$tmp"' EXIT
for bin in "${missing[@]}"; do
  echo "envtest-assets: go build ${pkgs[$bin]}"
  # Build to a temporary name and rename, so an interrupted build never
  # leaves a half-written binary that a later run would take as present.
  # -w: no DWARF, as the tests' binaries (Makefile, GO_TEST_LINK): nobody
  # debugs the control plane, and linking kube-apiserver without it took 7.5
  # CPU-seconds instead of 13.5 here (2026-12-03).
  ldflags="-w"
  [[ "$bin" == etcd ]] || ldflags="$k8s_ldflags -w"
  tmp="$(mktemp -p "$dir" ".$bin.XXXXXX")"
  go build -ldflags "$ldflags" -o "$tmp" "${pkgs[$bin]}"
  mv "$tmp" "$dir/$bin"
  stamp_of "$bin" > "$dir/.$bin.stamp"
done
echo "envtest-assets: done in $((SECONDS - start))s"
