package main

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// maxEarly bounds how early a pacer wakes before its deadline.
const maxEarly = 100_000 // ns

// pacer puts the open-loop sender to sleep until a request is due.
// time.Sleep will not do: Go's netpoller waits in whole milliseconds, so
// an idle program's sleep of 100 µs lasts about a millisecond, and every
// open-loop latency, measured from when the request was due, would carry
// that delay. A pacer arms a timerfd and reads it through the netpoller,
// which wakes in tens of µs. It does not spin (a spinning goroutine keeps
// the scheduler from polling the network, and so delays the receivers).
// Instead it learns how late its wake-ups are and sleeps that much less:
// Early is its estimate. Not safe for concurrent use: each sender has
// its own.
type pacer struct {
	f     *os.File
	fd    uintptr
	spec  itimerspec
	buf   [8]byte
	early int64 // ns: the mean lateness of recent wake-ups
}

// itimerspec is struct itimerspec of timerfd_settime(2).
type itimerspec struct {
	interval, value syscall.Timespec
}

const clockMonotonic = 1 // CLOCK_MONOTONIC

func newPacer() (*pacer, error) {
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic,
		syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, fmt.Errorf("timerfd_create: %w", errno)
	}
	// A non-blocking descriptor makes a pollable *os.File: reads wait in
	// the netpoller, not in a thread.
	return &pacer{f: os.NewFile(fd, "timerfd"), fd: fd}, nil
}

// lead returns how early, in ns, the pacer expects to wake: requests
// due within lead of now may be sent now.
func (p *pacer) lead() int64 { return p.early }

// sleepUntil sleeps until about nanotime t: it aims lead earlier, and
// wakes about lead late.
func (p *pacer) sleepUntil(t int64) error {
	wake := t - p.early
	d := wake - nanotime()
	if d <= 0 {
		return nil
	}
	p.spec.value = syscall.NsecToTimespec(d)
	_, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, p.fd, 0,
		uintptr(unsafe.Pointer(&p.spec)), 0, 0, 0)
	if errno != 0 {
		return fmt.Errorf("timerfd_settime: %w", errno)
	}
	if _, err := p.f.Read(p.buf[:]); err != nil {
		return fmt.Errorf("read timerfd: %w", err)
	}
	late := nanotime() - wake
	p.early = min(max(p.early+(late-p.early)/8, 0), maxEarly)
	return nil
}

func (p *pacer) close() error { return p.f.Close() }
