//go:build !linux

package proxytest

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
