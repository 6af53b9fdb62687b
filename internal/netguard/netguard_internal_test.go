package netguard

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Every network the keyword stands for is denied by Default.
func TestDefaultDeniesEachOfItsNetworks(t *testing.T) {
	d := Default()
	for _, c := range defaultCIDRs {
		assert.Error(t, d.Check(netip.MustParsePrefix(c).Addr()), c)
	}
}
