//go:build !unix

package harness

import "syscall"

// sysProcAttr has nothing to add where there are no process groups.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}
