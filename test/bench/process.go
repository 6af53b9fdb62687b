package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/ichor-dev/ichor-policy/test/harness"
)

// Controller is a running controller process (cmd/benchmanager).
type Controller struct {
	Name string
	// DecisionLogPath and LogPath hold its standard output and error.
	DecisionLogPath, LogPath string

	cmd   *exec.Cmd
	stats string
	done  chan error
}

// StartController runs binary with the stats endpoint on a socket this
// process listens on and hands over (-stats-fd), the mode flags, and, for
// mode cli, the arguments of `ichor`. A port found free and named to the
// child could be taken before the child listens: a run holds thousands of
// Talos API servers and connections on loopback ports, and in one run
// something did take it (a replica's "bind: address already in use" ended
// the whole run).
func StartController(binary, dir, name string, flags []string, cliArgs []string) (*Controller, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for %s's stats endpoint: %w", name, err)
	}
	socket, err := l.(*net.TCPListener).File()
	_ = l.Close() // the socket stays open through its duplicate
	if err != nil {
		return nil, fmt.Errorf("hand %s its stats endpoint: %w", name, err)
	}
	defer socket.Close() // the child holds its own
	args := append([]string{"-stats-fd", strconv.Itoa(statsFD)}, flags...)
	if len(cliArgs) > 0 {
		args = append(append(args, "--"), cliArgs...)
	}
	c := &Controller{Name: name, DecisionLogPath: filepath.Join(dir, name+".decisions.log"), LogPath: filepath.Join(dir, name+".log"), stats: l.Addr().String()}
	cmd := exec.Command(binary, args...)
	cmd.ExtraFiles = []*os.File{socket}
	// The manager's namespace, as the chart sets it: where its admission
	// key Secret is (harness.ManagerNamespace).
	return c, c.start(cmd, "POD_NAMESPACE="+harness.ManagerNamespace)
}

// statsFD is the descriptor of the stats endpoint's socket in the child: its
// first of exec.Cmd.ExtraFiles, after standard input, output and error.
const statsFD = 3

// start runs cmd with env added to this process's, its standard output and
// error into DecisionLogPath and LogPath.
func (c *Controller) start(cmd *exec.Cmd, env ...string) error {
	c.done = make(chan error, 1)
	stdout, err := os.Create(c.DecisionLogPath)
	if err != nil {
		return err
	}
	stderr, err := os.Create(c.LogPath)
	if err != nil {
		stdout.Close()
		return err
	}
	c.cmd = cmd
	c.cmd.Stdout, c.cmd.Stderr = stdout, stderr
	c.cmd.Env = append(os.Environ(), env...)
	if err := c.cmd.Start(); err != nil {
		stdout.Close()
		stderr.Close()
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	go func() {
		c.done <- c.cmd.Wait()
		stdout.Close()
		stderr.Close()
	}()
	return nil
}

// Pid is the process id.
func (c *Controller) Pid() int { return c.cmd.Process.Pid }

// WaitReady waits for the stats endpoint to answer (a peer: for it to be up
// a moment).
func (c *Controller) WaitReady(ctx context.Context) error {
	if c.stats == "" {
		return c.waitStarted(ctx)
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-c.done:
			c.done <- err
			return false, fmt.Errorf("%s exited: %v\n%s", c.Name, err, tail(c.LogPath, 20)) //nolint:errorlint // the exit status, nil on a clean exit, is for the reader
		default:
		}
		_, err := c.Stats(ctx)
		return err == nil, nil
	})
}

// WaitQuiet waits until the process has spent less than share of one CPU
// over a window, so that what is measured next is not the tail of its start:
// its caches filled, and the identity watches of machines left joining made.
// It says how long that took, or, after timeout, how busy the process still
// was.
func (c *Controller) WaitQuiet(ctx context.Context, window time.Duration, share float64, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	st, err := c.Stats(ctx)
	if err != nil {
		return 0, err
	}
	lastCPU, lastAt, busy := st.CPU, time.Now(), 0.0
	err = wait.PollUntilContextTimeout(ctx, window, timeout, false, func(ctx context.Context) (bool, error) {
		st, err := c.Stats(ctx)
		if err != nil {
			return false, err
		}
		now := time.Now()
		busy = float64(st.CPU-lastCPU) / float64(now.Sub(lastAt))
		lastCPU, lastAt = st.CPU, now
		return busy < share, nil
	})
	if err != nil {
		return time.Since(start), fmt.Errorf("%s not quiet within %s: %.0f%% of a CPU over the last %s: %w", c.Name, timeout, busy*100, window, err)
	}
	return time.Since(start), nil
}

// Stats asks the process for its Stats.
func (c *Controller) Stats(ctx context.Context) (Stats, error) {
	if c.stats == "" {
		return procStats(c.Pid())
	}
	var st Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.stats+"/stats", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("stats: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// StartProfile starts the process's CPU profile into file.
func (c *Controller) StartProfile(ctx context.Context, file string) error {
	return c.post(ctx, "/profile/start?file="+url.QueryEscape(file))
}

// HeapProfile writes the process's heap profile into file.
func (c *Controller) HeapProfile(ctx context.Context, file string) error {
	return c.post(ctx, "/profile/heap?file="+url.QueryEscape(file))
}

// StopProfile stops it and waits until the file is written.
func (c *Controller) StopProfile(ctx context.Context) error {
	return c.post(ctx, "/profile/stop")
}

func (c *Controller) post(ctx context.Context, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.stats+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
	return nil
}

// Stop ends the process with SIGTERM, as Kubernetes would, then waits.
func (c *Controller) Stop() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.done:
		return err
	case <-time.After(20 * time.Second):
		_ = c.cmd.Process.Kill()
		return <-c.done
	}
}

// tail is the last lines of a file, for an error message.
func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// ControlPlane is the processes of the harness (kube-apiserver, etcd, the
// CSR signer csrsigner): children of this process, found in /proc.
type ControlPlane map[string]int

// FindControlPlane finds this process's children by command name.
func FindControlPlane() (ControlPlane, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	out := ControlPlane{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		comm := s[open+1 : end]
		if ppid == self && (comm == "kube-apiserver" || comm == "etcd" || comm == "csrsigner") {
			out[comm] = pid
		}
	}
	return out, nil
}

// Check reports a process of the control plane that is gone: something on
// the machine stopped it (the run cannot go on).
func (p ControlPlane) Check() error {
	for _, name := range []string{"kube-apiserver", "etcd", "csrsigner"} {
		pid, ok := p[name]
		if !ok {
			return fmt.Errorf("the control plane has no %s process", name)
		}
		if err := syscall.Kill(pid, 0); err != nil {
			return fmt.Errorf("%s (pid %d) is gone: %w; was it stopped from outside?", name, pid, err)
		}
		if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(data), ") Z ") {
			return fmt.Errorf("%s (pid %d) has exited; was it stopped from outside?", name, pid)
		}
	}
	return nil
}

// CPU is the CPU time of each process.
func (p ControlPlane) CPU() map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, pid := range p {
		if d, err := ProcCPU(pid); err == nil {
			out[name] = d
		}
	}
	return out
}
