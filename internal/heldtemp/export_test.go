package heldtemp

import "time"

// SetStaleAge sets how old a free lock must be for its directory to be
// taken for nobody's, until the test ends.
func SetStaleAge(cleanup func(func()), age time.Duration) {
	old := staleAge
	staleAge = age
	cleanup(func() { staleAge = old })
}
