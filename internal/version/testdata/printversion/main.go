// Command printversion prints version.Get().Version: the test of the
// Makefile's LDFLAGS links it with them, which costs a second where linking
// ichor costs ten.
package main

import (
	"fmt"

	"github.com/ichor-dev/ichor-policy/internal/version"
)

func main() {
	info := version.Get()
	fmt.Println(info.Version, info.Revision)
}
