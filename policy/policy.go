// Package policy holds the Rego rules of ichor-policy, the tests beside each
// rule and the tables in data.json. The Go side only embeds them: the default
// bundle the binary serves is built from this tree (package bundles).
package policy

import "embed"

// FS is the policy tree: ichor/ (the decision rules), system/ (decision-log
// masking) and EPOCH, the bundle epoch of these rules (raised by a change
// that closes a hole; see docs/hardening.md). Test files are in it too;
// bundles leaves them out.
//
//go:embed ichor system EPOCH
var FS embed.FS
