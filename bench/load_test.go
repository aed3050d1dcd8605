package main

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/rld/rld/wire"
)

// stallTarget is an in-process target that answers each connection's
// requests one at a time, in order, at once, except that the first
// request it takes after stallAt waits stallFor: one stall of the whole
// target, as a garbage collection or a page fault would cause.
type stallTarget struct {
	stallAt  time.Time
	stallFor time.Duration
	once     sync.Once
}

func (t *stallTarget) dial() (conn, error) {
	c := &stallConn{t: t, reqs: make(chan uint32, maxDepthInTests), answers: make(chan answer, maxDepthInTests),
		done: make(chan struct{})}
	go c.serve()
	return c, nil
}

// maxDepthInTests bounds the depth of the loads on a stallTarget.
const maxDepthInTests = 64

type stallConn struct {
	t         *stallTarget
	pending   []uint32
	reqs      chan uint32
	answers   chan answer
	done      chan struct{}
	closeOnce sync.Once
	ans       answer
}

func (c *stallConn) serve() {
	for {
		select {
		case id := <-c.reqs:
			if time.Now().After(c.t.stallAt) {
				c.t.once.Do(func() { time.Sleep(c.t.stallFor) })
			}
			select {
			case c.answers <- answer{at: nanotime(), id: id, status: wire.StatusAllowed}:
			case <-c.done:
				return
			}
		case <-c.done:
			return
		}
	}
}

func (c *stallConn) queue(id uint32, key int) error {
	c.pending = append(c.pending, id)
	return nil
}

func (c *stallConn) flush() error {
	for _, id := range c.pending {
		select {
		case c.reqs <- id:
		case <-c.done:
			return net.ErrClosed
		}
	}
	c.pending = c.pending[:0]
	return nil
}

func (c *stallConn) recv(fn func(*answer)) error {
	select {
	case c.ans = <-c.answers:
		fn(&c.ans)
	case <-c.done:
		return net.ErrClosed
	}
	for {
		select {
		case c.ans = <-c.answers:
			fn(&c.ans)
		default:
			return nil
		}
	}
}

func (c *stallConn) close() error {
	c.closeOnce.Do(func() { close(c.done) })
	return nil
}

// countAtLeast returns how many values of h are at least v.
func countAtLeast(h *hdrhistogram.Histogram, v int64) int64 {
	var n int64
	for _, b := range h.Distribution() {
		if b.From >= v {
			n += b.Count
		}
	}
	return n
}

// TestCoordinatedOmission: one 100 ms stall of the target, under an open
// loop of 2000 requests/s, delays the ~200 requests due during it, and
// the open loop's latencies, measured from when each was due, show it:
// about rate × stall / 2 = 100 of them wait 50 ms or more, more than 1%,
// so p99 is above 50 ms. A closed loop on the same target sends nothing
// while its requests wait: only the depth requests in flight are slow,
// and p99 stays small. The stall is hidden: that is coordinated omission.
func TestCoordinatedOmission(t *testing.T) {
	const (
		rate     = 2000
		stall    = 100 * time.Millisecond
		warmup   = 200 * time.Millisecond
		duration = 2 * time.Second
		slow     = int64(50 * time.Millisecond)
	)
	keys, err := newKeySpace(distHot, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	measure := func(mode string, depth int, duration time.Duration) *measurement {
		t.Helper()
		l := &load{mode: mode, rate: rate, conns: 1, depth: depth, warmup: warmup, duration: duration, keys: keys, seed: 1}
		// The stall comes a third of the way into the measurement.
		tgt := &stallTarget{stallAt: time.Now().Add(startDelay + warmup + duration/3), stallFor: stall}
		m, err := runLoad(context.Background(), tgt, l, nil, nil)
		if err != nil {
			t.Fatalf("%s loop: %v", mode, err)
		}
		t.Logf("%s loop, depth %d: %d requests, p50 %v, p99 %v, max %v, %d of them ≥ %v",
			mode, depth, m.answered, time.Duration(m.hist.ValueAtQuantile(50)), time.Duration(m.hist.ValueAtQuantile(99)),
			time.Duration(m.hist.Max()), countAtLeast(m.hist, slow), time.Duration(slow))
		if m.timeouts() != 0 || m.unsent != 0 || m.strays != 0 {
			t.Errorf("%s loop: %d timeouts, %d unsent, %d strays", mode, m.timeouts(), m.unsent, m.strays)
		}
		return m
	}

	open := measure(modeOpen, 8, duration)
	if want := int64(rate * duration.Seconds()); open.answered < want*9/10 || open.answered > want {
		t.Errorf("open loop: %d requests answered, want about %d", open.answered, want)
	}
	if p99 := open.hist.ValueAtQuantile(99); p99 < slow {
		t.Errorf("open loop: p99 %v, want ≥ %v: the stall is hidden", time.Duration(p99), time.Duration(slow))
	}
	// rate × stall / 2 = 100 requests were due in the stall's first half.
	if n := countAtLeast(open.hist, slow); n < 60 || n > 140 {
		t.Errorf("open loop: %d requests ≥ %v, want about %d", n, time.Duration(slow), int(rate*stall.Seconds()/2))
	}
	if max := open.hist.Max(); max < int64(stall)*9/10 {
		t.Errorf("open loop: max %v, want about %v", time.Duration(max), stall)
	}

	for _, depth := range []int{1, 4} {
		closed := measure(modeClosed, depth, duration/2)
		if n := countAtLeast(closed.hist, slow); n < 1 || n > int64(depth) {
			t.Errorf("closed loop, depth %d: %d requests ≥ %v, want 1 to %d", depth, n, time.Duration(slow), depth)
		}
		if p99 := closed.hist.ValueAtQuantile(99); p99 >= int64(10*time.Millisecond) {
			t.Errorf("closed loop, depth %d: p99 %v, want it far below the stall", depth, time.Duration(p99))
		}
		if closed.answered <= open.answered {
			t.Errorf("closed loop, depth %d: %d requests, want more than the open loop's %d", depth, closed.answered, open.answered)
		}
	}
}
