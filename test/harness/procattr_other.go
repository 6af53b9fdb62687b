//go:build unix && !linux

package harness

import "syscall"

// sysProcAttr puts the CSR signer in its own process group, so a
// terminal's Ctrl-C reaches the caller, which stops it in order.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
