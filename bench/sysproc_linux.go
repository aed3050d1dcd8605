package main

import "syscall"

// sysProcAttr makes a started process die with rld-bench, even when
// rld-bench is killed and cannot stop it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
