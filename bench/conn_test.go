package main

import (
	"context"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/rld/rld/wire"
)

// startEcho serves the echo server in process on a socket in a temporary
// directory and returns its path.
func startEcho(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "echo.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go serveEcho(ln)
	return sock
}

func testTemplate(t *testing.T) *template {
	t.Helper()
	tm, err := parseTemplate(defaultDescriptors, 999)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// TestWireConnEcho: answers come back with the ids of the requests, as
// rld's typical answer: allowed, rule "bench", the size of rld's.
func TestWireConnEcho(t *testing.T) {
	c, err := (&socketTarget{path: startEcho(t), tmpl: testTemplate(t), cost: 1}).dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	ids := []uint32{7, 0, 65535}
	for i, id := range ids {
		if err := c.queue(id, i); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.flush(); err != nil {
		t.Fatal(err)
	}
	var got []uint32
	for len(got) < len(ids) {
		err := c.recv(func(a *answer) {
			if a.status != wire.StatusAllowed || a.at <= 0 {
				t.Errorf("answer %+v", a)
			}
			got = append(got, a.id)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, ids) {
		t.Errorf("ids %v, want %v", got, ids)
	}
	if len(echoAnswer) != wire.HeaderSize+50+len(benchRule) {
		t.Errorf("echo answer of %d bytes", len(echoAnswer))
	}
}

// TestHotLoopDoesNotAllocate: a request's encoding, sending, and its
// answer's reading and decoding allocate nothing.
func TestHotLoopDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c, err := (&socketTarget{path: startEcho(t), tmpl: testTemplate(t), cost: 1}).dial()
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	n := 0
	fn := func(*answer) { n++ }
	key := 0
	allocs := testing.AllocsPerRun(1000, func() {
		key = (key + 1) % 1000
		c.queue(uint32(key), key)
		c.queue(uint32(key+1), key)
		c.flush()
		for want := n + 2; n < want; {
			if err := c.recv(fn); err != nil {
				t.Fatal(err)
			}
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per round trip", allocs)
	}
}

// TestRunLoadEcho runs both loops against the echo server over its
// socket: every request is answered and allowed.
func TestRunLoadEcho(t *testing.T) {
	sock := startEcho(t)
	keys, err := newKeySpace(distZipf, 1000, 1.1)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{modeOpen, modeClosed} {
		l := &load{mode: mode, rate: 5000, conns: 2, depth: 4, warmup: 100 * time.Millisecond,
			duration: 300 * time.Millisecond, keys: keys, seed: 1}
		m, err := runLoad(context.Background(), &socketTarget{path: sock, tmpl: testTemplate(t), cost: 1}, l, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if m.answered == 0 || m.byStatus[wire.StatusAllowed] != m.answered || m.timeouts() != 0 || m.strays != 0 || m.unsent != 0 {
			t.Errorf("%s: %d answered, %v by status, %d timeouts, %d strays, %d unsent", mode, m.answered, m.byStatus,
				m.timeouts(), m.strays, m.unsent)
		}
		if m.hist.TotalCount() != m.answered {
			t.Errorf("%s: %d latencies for %d answers", mode, m.hist.TotalCount(), m.answered)
		}
		if mode == modeOpen && (m.answered < 1400 || m.answered > 1500) {
			t.Errorf("open: %d answered, want about 1500 (5000/s for 300 ms)", m.answered)
		}
	}
}

// TestRunLoadDeadTarget: a target that stops answering is cut off at the
// hard stop, its requests counted as timeouts, and the run ends by
// itself.
func TestRunLoadDeadTarget(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "dead.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, reads, never answers
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	keys, _ := newKeySpace(distHot, 1, 0)
	l := &load{mode: modeOpen, rate: 1000, conns: 1, depth: 4, duration: 200 * time.Millisecond, keys: keys,
		drain: 300 * time.Millisecond}
	start := time.Now()
	m, err := runLoad(context.Background(), &socketTarget{path: sock, tmpl: testTemplate(t), cost: 1}, l, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the run took %v", took)
	}
	if m.answered != 0 || m.timeouts() != 4 || m.unsent < 150 {
		t.Errorf("%d answered, %d timeouts, %d unsent; want 0, 4 (the depth), about 196", m.answered, m.timeouts(), m.unsent)
	}
}

// TestRunLoadInterrupted: cancelling the context stops a run at once.
func TestRunLoadInterrupted(t *testing.T) {
	keys, _ := newKeySpace(distHot, 1, 0)
	l := &load{mode: modeClosed, conns: 2, depth: 2, duration: time.Minute, keys: keys}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := runLoad(ctx, &socketTarget{path: startEcho(t), tmpl: testTemplate(t), cost: 1}, l, nil, nil)
	if err == nil {
		t.Fatal("no error")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("stopping took %v", took)
	}
}

// TestLoadDoesNotAllocate: the whole client — scheduling, ids, encoding,
// decoding, recording — allocates nothing per request: a closed-loop run
// of tens of thousands of requests makes only its fixed set-up
// allocations.
func TestLoadDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	sock := startEcho(t)
	keys, _ := newKeySpace(distZipf, 1000, 1.1)
	l := &load{mode: modeClosed, conns: 2, depth: 8, duration: 300 * time.Millisecond, keys: keys}
	tgt := &socketTarget{path: sock, tmpl: testTemplate(t), cost: 1}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	m, err := runLoad(context.Background(), tgt, l, nil, nil)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	allocs := after.Mallocs - before.Mallocs
	t.Logf("%d allocations for %d requests", allocs, m.sent)
	if m.sent < 10_000 || float64(allocs) > 0.01*float64(m.sent) {
		t.Errorf("%d allocations for %d requests", allocs, m.sent)
	}
}
