//go:build !linux

package redistest

import "syscall"

const sigterm = syscall.SIGTERM

func sysProcAttr() *syscall.SysProcAttr { return nil }
