// Package chart holds the tests of the Helm chart in this directory; the
// chart itself is the YAML beside this file (.helmignore keeps the Go files
// out of it).
//
// The tests render the chart with the Helm release pinned in tools/helm and
// check what a reviewer must be able to trust without reading the
// templates: the copies of the generated manifests (CRDs, the manager's
// RBAC, the webhook configuration, the shipped roles) are identical to their
// sources, the manager's rights on certificates.k8s.io pass the RBAC
// invariant of policy/ichor/rbac, the webhook is wired to the manager's
// pods with the certificates of the mode chosen, and an upgrade keeps the
// certificates the manager wrote.
package chart
