package harness

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// Main runs a package's tests against one control plane started for all of
// them, and returns TestMain's exit code:
//
//	func TestMain(m *testing.M) { os.Exit(harness.Main(m, harness.Options{}, setUp)) }
//
// It starts the control plane, calls setUp with it (the package's manager,
// webhook and RBAC; the cleanup it returns runs after the tests, before the
// control plane stops), runs the tests, prints the control plane's last log
// lines when a test or the set-up failed, and stops it.
func Main(m *testing.M, opts Options, setUp func(ctx context.Context, env *Env) (cleanup func(), err error)) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	env, err := Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the control plane:", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop the control plane:", err)
		}
	}()
	cleanup, err := setUp(ctx, env)
	if cleanup != nil {
		defer cleanup()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "set up:", err)
		fmt.Fprintln(os.Stderr, env.TailLogs(30))
		return 1
	}
	fmt.Fprintf(os.Stderr, "control plane ready in %s\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, env.TailLogs(30))
	}
	return code
}

// StartForTest starts a control plane for one test (or one group of
// subtests) rather than a package: it is stopped when the test ends, and its
// last log lines are printed when the test failed.
func StartForTest(t testing.TB, opts Options) *Env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	env, err := Start(ctx, opts)
	if err != nil {
		cancel()
		t.Fatalf("start the control plane: %v", err)
	}
	t.Cleanup(func() {
		defer cancel()
		if t.Failed() {
			t.Log(env.TailLogs(30))
		}
		if err := env.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	return env
}
