package usage_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ichor-dev/ichor-policy/internal/usage"
)

func TestAUsageErrorIsFoundThroughWrapping(t *testing.T) {
	base := errors.New("no such file")
	err := fmt.Errorf("--bundle-key: %w", usage.Wrap(base))
	if !usage.Is(err) {
		t.Fatalf("usage.Is(%v) = false, want true", err)
	}
	if !errors.Is(err, base) {
		t.Fatalf("the wrapped error is lost: %v", err)
	}
	if got, want := err.Error(), "--bundle-key: no such file"; got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
}

func TestOtherErrorsAreNotUsageErrors(t *testing.T) {
	if usage.Is(errors.New("connection refused")) {
		t.Fatal("a plain error counted as a usage error")
	}
	if usage.Is(nil) {
		t.Fatal("nil counted as a usage error")
	}
	if usage.Wrap(nil) != nil {
		t.Fatal("Wrap(nil) is not nil")
	}
	if !usage.Is(usage.Errorf("--ttl %s is negative", "-1s")) {
		t.Fatal("Errorf is not a usage error")
	}
}
