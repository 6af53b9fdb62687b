package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
)

// TestNoFlagUsageHasBackQuotes: pflag turns back-quoted text in a usage into
// the value's placeholder name, so a quoted command garbles the help.
func TestNoFlagUsageHasBackQuotes(t *testing.T) {
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		visit := func(f *pflag.Flag) {
			assert.NotContains(t, f.Usage, "`", "%s --%s", c.CommandPath(), f.Name)
		}
		c.Flags().VisitAll(visit)
		c.PersistentFlags().VisitAll(visit)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(strings.NewReader(""), io.Discard, io.Discard))
}
