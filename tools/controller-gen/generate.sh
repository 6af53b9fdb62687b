#!/usr/bin/env bash
# Regenerates api/v1alpha1/zz_generated.deepcopy.go, deploy/crds/*.yaml and
# deploy/rbac/role.yaml
# from the kubebuilder markers in api/v1alpha1, with the controller-gen
# release pinned in this directory's go.mod.
#
#   tools/controller-gen/generate.sh
#
# Idempotent: running it twice leaves the tree unchanged.
set -euo pipefail

export GOTOOLCHAIN=local
export GOFLAGS=-buildvcs=false

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"

# `go tool -n` builds the pinned controller-gen (cached after the first run)
# and prints its path. It has to run inside the tool module, while
# controller-gen itself must run from the main module so it loads
# api/v1alpha1 with the main module's dependencies.
controller_gen="$(go -C "${here}" tool -n controller-gen)"

cd "${root}"

"${controller_gen}" \
	object:headerFile=hack/boilerplate.go.txt \
	paths=./api/...

# Generate into a scratch directory and swap it in only on success, so a
# marker error leaves the checked-in manifests as they were, and a renamed
# or removed kind leaves no stale manifest behind.
scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT

"${controller_gen}" \
	crd \
	paths=./api/... \
	output:crd:artifacts:config="${scratch}"

mkdir -p deploy/crds
rm -f deploy/crds/ichor.dev_*.yaml
cp "${scratch}"/ichor.dev_*.yaml deploy/crds/

# The manager's ClusterRole, from the +kubebuilder:rbac markers of the
# reconcilers and the webhook: least privilege is reviewed where the code is.
"${controller_gen}" \
	rbac:roleName=ichor-policy-manager \
	paths=./... \
	output:rbac:dir="${scratch}/rbac"
mkdir -p deploy/rbac
cp "${scratch}/rbac/role.yaml" deploy/rbac/role.yaml

# The ValidatingWebhookConfiguration, from the +kubebuilder:webhook marker.
"${controller_gen}" webhook paths=./webhook/... output:webhook:dir="${scratch}/webhook"
mkdir -p deploy/webhook
cp "${scratch}/webhook/manifests.yaml" deploy/webhook/manifests.yaml
