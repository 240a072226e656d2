package redistest

import "syscall"

const sigterm = syscall.SIGTERM

// sysProcAttr kills the server when the test process dies, so that a crashed
// test leaves no redis-server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
