package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

var (
	buildMu   sync.Mutex
	buildPath string
)

// TestBinaryEnv names an ichor built for the tests by the caller: `make
// go-test` builds cmd/ichor once, with the suite's flags, and every test
// package that runs the binary shares it instead of linking its own.
const TestBinaryEnv = "ICHOR_TEST_BINARY"

// BuildIchor returns the path of an ichor built from this checkout: the one
// $ICHOR_TEST_BINARY names, else cmd/ichor built once per test process, into
// dir on the first call. Tests that run the real manager as a process share
// it. When the binary built earlier is gone (its dir was the t.TempDir of a
// test that has ended), it is built again into dir.
func BuildIchor(dir string) (string, error) {
	if path := os.Getenv(TestBinaryEnv); path != "" {
		info, err := os.Stat(path) //nolint:gosec // G703: the binary the caller (make go-test) built for the tests
		if err != nil {
			return "", fmt.Errorf("harness: $%s: %w", TestBinaryEnv, err)
		}
		if info.IsDir() || info.Mode().Perm()&0o111 == 0 {
			return "", fmt.Errorf("harness: $%s (%s) is not an executable file", TestBinaryEnv, path)
		}
		return path, nil
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildPath != "" {
		if _, err := os.Stat(buildPath); err == nil {
			return buildPath, nil
		}
	}
	root, starts, ok := repoRoot()
	if !ok {
		return "", fmt.Errorf("harness: repository root not found above %v", starts)
	}
	path := filepath.Join(dir, "ichor")
	cmd := exec.Command("go", "build", "-o", path, "./cmd/ichor")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("harness: build cmd/ichor: %w: %s", err, out)
	}
	buildPath = path
	return buildPath, nil
}

// ManagerOptions configure a manager process.
type ManagerOptions struct {
	// Binary is `ichor` (BuildIchor).
	Binary string
	// Dir receives the decision log (stdout) and the manager's log (stderr).
	Dir string
	// Name names the files, so that several managers share Dir.
	Name string
	// Kubeconfig is the file the manager runs with.
	Kubeconfig string
	// Args are `ichor manager`'s flags besides --kubeconfig.
	Args []string
	// Env is added to the process's environment (POD_NAMESPACE=..., say).
	Env []string
}

// ManagerProcess is a running `ichor manager`.
type ManagerProcess struct {
	cmd *exec.Cmd
	// DecisionLog and Log are the paths of its standard output and error.
	DecisionLog, Log string
	done             chan struct{}
	err              error
}

// StartManager starts `ichor manager` as a process of its own.
func StartManager(o ManagerOptions) (*ManagerProcess, error) {
	m := &ManagerProcess{
		DecisionLog: filepath.Join(o.Dir, o.Name+".decisions.log"),
		Log:         filepath.Join(o.Dir, o.Name+".log"),
		done:        make(chan struct{}),
	}
	stdout, err := os.Create(m.DecisionLog)
	if err != nil {
		return nil, err
	}
	stderr, err := os.Create(m.Log)
	if err != nil {
		stdout.Close()
		return nil, err
	}
	// The tests' Talos API servers answer on this host's loopback, which
	// the manager denies by default (a machine's endpoint is whoever
	// writes the TalosMachine's to name): allowed here, before the test's
	// own flags, which may deny again.
	m.cmd = exec.Command(o.Binary, append([]string{"manager", "--kubeconfig", o.Kubeconfig, "--node-denied-networks="}, o.Args...)...)
	m.cmd.Stdout, m.cmd.Stderr = stdout, stderr
	// The manager's own temporary files (the engine's bundle directory) go
	// under Dir, which the test removes: a manager the test kills cannot
	// remove them itself.
	m.cmd.Env = append(append(os.Environ(), "TMPDIR="+o.Dir), o.Env...)
	if err := m.cmd.Start(); err != nil {
		stdout.Close()
		stderr.Close()
		return nil, fmt.Errorf("start %s manager: %w", o.Binary, err)
	}
	go func() {
		m.err = m.cmd.Wait()
		stdout.Close()
		stderr.Close()
		close(m.done)
	}()
	return m, nil
}

// Signal sends sig to the process.
func (m *ManagerProcess) Signal(sig syscall.Signal) error {
	return m.cmd.Process.Signal(sig)
}

// Done is closed when the process has exited.
func (m *ManagerProcess) Done() <-chan struct{} { return m.done }

// Stop ends the process as Kubernetes would: SIGTERM, then SIGKILL after
// grace. It returns the process's exit error.
func (m *ManagerProcess) Stop(grace time.Duration) error {
	select {
	case <-m.done:
		return m.err
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.done:
	case <-time.After(grace):
		_ = m.cmd.Process.Kill()
		<-m.done
	}
	return m.err
}

// Kill ends the process at once, as a crash would.
func (m *ManagerProcess) Kill() {
	_ = m.cmd.Process.Kill()
	<-m.done
}

// TailLog is the end of the manager's log, for a failing test.
func (m *ManagerProcess) TailLog(lines int) string {
	return tailFile(m.Log, lines)
}
