//go:build !linux

package main

import "time"

// pacer puts the open-loop sender to sleep until a request is due. Away
// from Linux it uses time.Sleep, which may wake up to a millisecond late
// and adds that to open-loop latencies (see pace_linux.go).
type pacer struct{}

func newPacer() (*pacer, error) { return &pacer{}, nil }

// lead returns how early the pacer expects to wake: never.
func (p *pacer) lead() int64 { return 0 }

// sleepUntil returns at nanotime t or after it.
func (p *pacer) sleepUntil(t int64) error {
	if d := t - nanotime(); d > 0 {
		time.Sleep(time.Duration(d))
	}
	return nil
}

func (p *pacer) close() error { return nil }
