package redisx_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// singleCalls are the two kinds of single call that may go direct: a
// Store call (Client.exec) and a Do of one op (the hot-key cache's miss,
// a takelease with lease accounting).
var singleCalls = []struct {
	name string
	take func(rs *redisx.Store, key string, p algo.Params) (algo.Result, error)
}{
	{"exec", func(rs *redisx.Store, key string, p algo.Params) (algo.Result, error) {
		return rs.Take(context.Background(), []byte(key), p, 1, time.Now(), false)
	}},
	{"do", func(rs *redisx.Store, key string, p algo.Params) (algo.Result, error) {
		ops := []algo.Op{{
			Kind: algo.OpTakeLease, Key: []byte(key), Params: p, Costs: []int64{1},
			Holder: "direct-test", LeaseLife: time.Second,
		}}
		if err := rs.Do(context.Background(), ops); err != nil {
			return algo.Result{}, err
		}
		r := ops[0].Result
		r.Allowed = ops[0].Admitted == 1
		return r, ops[0].Err
	}},
}

// TestDirectCalls: calls that do not overlap go over the direct
// connection once it is made, concurrent ones share the pipeline, and
// every call is applied exactly once either way: a key with a limit of
// 300 admits exactly 300 of the takes, sequential then concurrent.
func TestDirectCalls(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, sc := range singleCalls {
		t.Run(sc.name, func(t *testing.T) {
			c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}})
			rs := redisx.NewStore(c)
			p := algo.Params{Kind: algo.FixedWindow, Limit: 300, Period: time.Hour}
			var allowed atomic.Int64
			take := func() {
				r, err := sc.take(rs, "direct-"+sc.name, p)
				if !assert.NoError(t, err) {
					return
				}
				if r.Allowed {
					allowed.Add(1)
				}
			}
			// One at a time, until 50 have gone direct (the first ones go
			// through the pipeline while the direct connection is dialled).
			calls := 0
			for deadline := time.Now().Add(10 * time.Second); c.DirectCalls() < 50; calls++ {
				require.False(t, time.Now().After(deadline), "%d of %d calls direct after 10 s", c.DirectCalls(), calls)
				take()
			}
			require.Less(t, calls, 300, "the limit must not be reached yet")
			direct := c.DirectCalls()

			// Concurrently, past the limit.
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 60 {
						take()
					}
				})
			}
			wg.Wait()
			assert.EqualValues(t, 300, allowed.Load(), "admitted by %d calls, %d direct", calls+480, c.DirectCalls())
			t.Logf("%d sequential calls, %d direct; then 480 concurrent, %d direct", calls, direct, c.DirectCalls()-direct)
		})
	}
}

// TestDirectAfterFailure: a direct call that times out (Redis paused)
// fails like a pipelined one, within the timeout; once Redis answers
// again calls succeed and go direct again. Calls after a restart all
// succeed: a direct connection that Redis closed is not reused.
func TestDirectAfterFailure(t *testing.T) {
	srv := redistest.Standalone(t)
	const timeout = 200 * time.Millisecond
	for _, sc := range singleCalls {
		t.Run(sc.name, func(t *testing.T) {
			c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}, Timeout: timeout})
			rs := redisx.NewStore(c)
			p := algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000, Period: time.Second}
			take := func() error {
				_, err := sc.take(rs, "k", p)
				return err
			}
			untilDirect := func(what string) {
				t.Helper()
				from := c.DirectCalls()
				redistest.WaitFor(t, what, func() bool {
					return take() == nil && c.DirectCalls() > from+5
				})
			}
			untilDirect("calls to go direct")

			srv.Pause()
			start := time.Now()
			err := take()
			elapsed := time.Since(start)
			srv.Resume()
			require.Error(t, err, "redis is paused")
			assert.Less(t, elapsed, 5*timeout, "the call ends at its deadline")
			untilDirect("calls to go direct after the pause")

			srv.Kill()
			srv.Start(t)
			// Every call after the restart succeeds, the first one included.
			for i := range 50 {
				require.NoError(t, take(), "call %d after the restart", i)
			}
			untilDirect("calls to go direct after the restart")
		})
	}
}

// TestDirectClientKill: Redis closes the direct connection (CLIENT
// KILL, as its idle timeout, a proxy or an operator would) between two
// calls; the next call, and every one after it, succeeds: the closed
// direct connection is seen before it is used, and the call goes through
// the pipeline.
func TestDirectClientKill(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, sc := range singleCalls {
		t.Run(sc.name, func(t *testing.T) {
			testDirectClientKill(t, srv, sc.take)
		})
	}
}

func testDirectClientKill(t *testing.T, srv *redistest.Server, call func(*redisx.Store, string, algo.Params) (algo.Result, error)) {
	c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}})
	rs := redisx.NewStore(c)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000, Period: time.Second}
	take := func() error {
		_, err := call(rs, "k", p)
		return err
	}
	for round := range 3 {
		from := c.DirectCalls()
		redistest.WaitFor(t, "calls to go direct", func() bool {
			return take() == nil && c.DirectCalls() > from+5
		})
		list, err := redistest.Do(srv.Addr, "CLIENT", "LIST")
		require.NoError(t, err)
		killed := 0
		for _, line := range strings.Split(list, "\n") {
			if !strings.Contains(line, " name=rld-direct ") {
				continue
			}
			for _, f := range strings.Fields(line) {
				if addr, ok := strings.CutPrefix(f, "addr="); ok {
					_, err := redistest.Do(srv.Addr, "CLIENT", "KILL", "ADDR", addr)
					require.NoError(t, err)
					killed++
				}
			}
		}
		require.Positive(t, killed, "direct connections in CLIENT LIST:\n%s", list)
		for i := range 20 {
			require.NoError(t, take(), "round %d: call %d after the kill", round, i)
		}
	}
}
