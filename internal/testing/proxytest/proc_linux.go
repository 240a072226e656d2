package proxytest

import "syscall"

// sysProcAttr kills the proxy when the test process dies, so that a crashed
// test leaves no proxy behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
