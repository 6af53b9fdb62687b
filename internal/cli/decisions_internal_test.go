package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// A pod whose log cannot be read is said on one line, whatever the API
// server's message holds (review 255 F6: a 403's reason is the authorizer's,
// and printed as it was a newline in it made a line of its own).
func TestASkippedPodIsOneLine(t *testing.T) {
	var buf bytes.Buffer
	err := apierrors.NewForbidden(schema.GroupResource{Resource: "pods/log"}, "ichor-0",
		errors.New("no\nichor: read 9 decisions from 1 pod\x1b[2J"))
	podSkipped(&buf, "ichor-0", err)
	out := buf.String()
	assert.Equal(t, 1, strings.Count(out, "\n"), out)
	assert.True(t, strings.HasPrefix(out, "ichor: pod ichor-0 skipped: "), out)
	assert.NotContains(t, out, "\x1b")
}
