package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// kcmStopTimeout is how long kube-controller-manager gets to exit on SIGTERM
// before it is killed; it holds no state worth a graceful exit.
const kcmStopTimeout = 10 * time.Second

// controllerManager is a kube-controller-manager child process.
type controllerManager struct {
	cmd     *exec.Cmd
	logPath string
	log     *os.File

	done    chan struct{} // closed once Wait has returned
	waitErr error

	stopOnce sync.Once
	stopErr  error
}

// kcmArgs runs the CSR signing controller and nothing else. csrapproving in
// particular must never run: the approver under test would not be the only
// one, and an approval by kube-controller-manager would pass for Ichor's.
// Secure serving is off (port 0): nothing scrapes it, and readiness is proven
// by a signed certificate instead of a health endpoint.
func kcmArgs(kubeconfig, caCert, caKey string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=csrsigning",
		"--cluster-signing-cert-file=" + caCert,
		"--cluster-signing-key-file=" + caKey,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--v=2",
	}
}

func startControllerManager(binary, logPath string, args []string) (*controllerManager, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager log: %w", err)
	}

	cmd := exec.Command(binary, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()

	if err = cmd.Start(); err != nil {
		logFile.Close() //nolint:errcheck // nothing was written

		return nil, fmt.Errorf("start %s: %w", filepath.Base(binary), err)
	}

	kcm := &controllerManager{cmd: cmd, logPath: logPath, log: logFile, done: make(chan struct{})}

	go func() {
		kcm.waitErr = cmd.Wait()
		close(kcm.done)
	}()

	return kcm, nil
}

// exited reports whether the process has ended, with its exit error.
func (k *controllerManager) exited() (bool, error) {
	select {
	case <-k.done:
		return true, k.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM, kills after kcmStopTimeout, and returns only once the
// process has been reaped, so nothing outlives Env.Stop.
func (k *controllerManager) stop() error {
	k.stopOnce.Do(func() {
		defer k.log.Close() //nolint:errcheck // the log is complete once the process is gone

		if done, _ := k.exited(); done {
			return
		}

		if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			k.stopErr = fmt.Errorf("signal kube-controller-manager: %w", err)
		}

		select {
		case <-k.done:
		case <-time.After(kcmStopTimeout):
			if err := k.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				k.stopErr = errors.Join(k.stopErr, fmt.Errorf("kill kube-controller-manager: %w", err))
			}

			<-k.done
		}
	})

	return k.stopErr
}
