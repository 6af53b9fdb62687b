// Package policy holds the Rego rules of ichor-policy, the tests beside each
// rule and the tables in data.json. The Go side only embeds them: the default
// bundle the binary serves is built from this tree (package bundles).
package policy

import "embed"

// FS is the policy tree: ichor/ (the decision rules) and system/ (decision-log
// masking). Test files are in it too; bundles leaves them out.
//
//go:embed ichor system
var FS embed.FS
