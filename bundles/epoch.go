package bundles

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"

	"github.com/open-policy-agent/opa/v1/bundle"

	"github.com/ichor-dev/ichor-policy/policy"
)

// EpochKey is where a bundle's epoch is written: the metadata of its
// .manifest, which OPA's bundle signature covers like every other file (a
// signed bundle whose manifest was changed, added or removed is refused).
//
// The epoch says how new a bundle's rules are, in the only sense that
// matters against a rollback: a policy change that closes a hole raises it,
// and a manager refuses a signed bundle whose epoch is below the floor
// compiled into its binary or below the highest it (or any replica) has
// activated. The revision, a digest, cannot say which of two bundles is
// newer; the epoch can, and whoever may only move a tag cannot forge it.
const EpochKey = "ichor_epoch"

// EpochFile is the file of a policy tree that holds its epoch, a decimal
// integer: raised in the same change as the rule that closes a hole.
const EpochFile = "EPOCH"

// ErrNoEpoch is a bundle that carries no epoch.
var ErrNoEpoch = errors.New("the bundle carries no epoch (" + EpochKey + " in its .manifest metadata): build it with `ichor bundle build`")

// Epoch is a bundle manifest's epoch.
func Epoch(m bundle.Manifest) (int64, error) {
	v, ok := m.Metadata[EpochKey]
	if !ok {
		return 0, ErrNoEpoch
	}
	// The manifest comes as JSON: the number may be a float64 or a
	// json.Number, depending on who decoded it.
	raw, err := json.Marshal(v)
	if err != nil {
		return 0, fmt.Errorf("bundle epoch: %w", err)
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bundle epoch %s is not a non-negative integer", raw)
	}
	return n, nil
}

// SetEpoch writes a bundle's epoch into its manifest; sign the bundle after.
func SetEpoch(b *bundle.Bundle, epoch int64) {
	if b.Manifest.Metadata == nil {
		b.Manifest.Metadata = map[string]any{}
	}
	b.Manifest.Metadata[EpochKey] = epoch
}

// readEpochFile reads a policy tree's EPOCH; ok is false when it has none.
func readEpochFile(fsys fs.FS) (epoch int64, ok bool, err error) {
	raw, err := fs.ReadFile(fsys, EpochFile)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("policy epoch: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil || n < 0 {
		return 0, false, fmt.Errorf("policy epoch: %s holds %q, not a non-negative integer", EpochFile, strings.TrimSpace(string(raw)))
	}
	return n, true, nil
}

var floor = sync.OnceValues(func() (int64, error) {
	n, ok, err := readEpochFile(policy.FS)
	if err == nil && !ok {
		err = fmt.Errorf("the embedded policy tree has no %s", EpochFile)
	}
	return n, err
})

// Floor is the lowest epoch a manager of this binary accepts from a signed
// bundle: the epoch of the rules embedded in it. A signed bundle below it
// predates a hole this release closed.
func Floor() int64 {
	n, err := floor()
	if err != nil {
		// The embed directive of package policy names the file; a tree
		// without it does not build.
		panic(err)
	}
	return n
}
