package harness

import "syscall"

// sysProcAttr puts the CSR signer in its own process group, so a
// terminal's Ctrl-C reaches the demo (which then stops it in order) rather than
// the child, and asks the kernel to kill it if this process dies without
// calling Stop (a test binary killed at its timeout). Go never retires an
// unlocked OS thread, so the parent-death signal is not sent early.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
