#!/usr/bin/env bash
# Builds the control-plane binaries the integration tests and the demo run
# (kube-apiserver, kube-controller-manager, etcd) from the versions pinned in
# this module, into a cache directory outside the repository, once. The
# public envtest binary download is not reachable here, so they come from source.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${1:?usage: build.sh OUTPUT_DIR}"
mkdir -p "$dir"

declare -A pkgs=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [etcd]=go.etcd.io/etcd/server/v3
)

missing=()
for bin in kube-apiserver kube-controller-manager etcd; do
  [[ -x "$dir/$bin" ]] || missing+=("$bin")
done
if ((${#missing[@]} == 0)); then
  echo "envtest-assets: up to date in $dir"
  exit 0
fi

echo "envtest-assets: building ${missing[*]} into $dir"
echo "envtest-assets: a cold build takes about 11 minutes on two cores; later runs reuse it"
start=$SECONDS
cd "$here"
for bin in "${missing[@]}"; do
  echo "envtest-assets: go build ${pkgs[$bin]}"
  # Build to a temporary name and rename, so an interrupted build never
  # leaves a half-written binary that a later run would take as present.
  go build -o "$dir/.$bin.tmp" "${pkgs[$bin]}"
  mv "$dir/.$bin.tmp" "$dir/$bin"
done
echo "envtest-assets: done in $((SECONDS - start))s"
