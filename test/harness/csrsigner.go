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

// signerBinary is the CSR signer in the assets directory: kube-controller-manager's
// CSR signing controller alone (tools/envtest/cmd/csrsigner), the one part of
// kube-controller-manager the tests need, built from the same pinned module.
const signerBinary = "csrsigner"

// signerStopTimeout is how long the signer gets to exit on SIGTERM before it
// is killed; it holds no state worth a graceful exit.
const signerStopTimeout = 10 * time.Second

// csrSigner is the CSR signer's child process.
type csrSigner struct {
	cmd     *exec.Cmd
	logPath string
	log     *os.File

	done    chan struct{} // closed once Wait has returned
	waitErr error

	stopOnce sync.Once
	stopErr  error
}

// signerArgs sign with the bundle's Kubernetes CA for a year at most
// (kube-controller-manager's default --cluster-signing-duration, the signer's
// too) or the shorter spec.expirationSeconds. The signer runs
// kube-controller-manager's csrsigning controller and nothing else: no
// approver (csrapproving) is even in the binary, so the approver under test
// is the only one and no approval passes for Ichor's. It serves nothing:
// readiness is proven by a signed certificate instead of a health endpoint.
func signerArgs(kubeconfig, caCert, caKey string) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--cluster-signing-cert-file=" + caCert,
		"--cluster-signing-key-file=" + caKey,
		"--v=2",
	}
}

func startSigner(binary, logPath string, args []string) (*csrSigner, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("CSR signer log: %w", err)
	}

	cmd := exec.Command(binary, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()

	if err = cmd.Start(); err != nil {
		logFile.Close() //nolint:errcheck // nothing was written

		return nil, fmt.Errorf("start %s: %w", filepath.Base(binary), err)
	}

	signer := &csrSigner{cmd: cmd, logPath: logPath, log: logFile, done: make(chan struct{})}

	go func() {
		signer.waitErr = cmd.Wait()
		close(signer.done)
	}()

	return signer, nil
}

// exited reports whether the process has ended, with its exit error.
func (k *csrSigner) exited() (bool, error) {
	select {
	case <-k.done:
		return true, k.waitErr
	default:
		return false, nil
	}
}

// stop sends SIGTERM, kills after signerStopTimeout, and returns only once the
// process has been reaped, so nothing outlives Env.Stop.
func (k *csrSigner) stop() error {
	k.stopOnce.Do(func() {
		defer k.log.Close() //nolint:errcheck // the log is complete once the process is gone

		if done, _ := k.exited(); done {
			return
		}

		if err := k.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			k.stopErr = fmt.Errorf("signal the CSR signer: %w", err)
		}

		select {
		case <-k.done:
		case <-time.After(signerStopTimeout):
			if err := k.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				k.stopErr = errors.Join(k.stopErr, fmt.Errorf("kill the CSR signer: %w", err))
			}

			<-k.done
		}
	})

	return k.stopErr
}
