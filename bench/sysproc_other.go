//go:build !linux

package main

import "syscall"

// sysProcAttr: away from Linux, started processes are stopped by
// rld-bench's clean-up only.
func sysProcAttr() *syscall.SysProcAttr { return nil }
