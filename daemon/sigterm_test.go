package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/config"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// TestSIGTERMUnderLoad: an rld process on Redis, with pipelining clients
// checking a cached rule as fast as they can, gets SIGTERM. No request
// vanishes: every one gets an answer or a connection error the client can
// retry, none waits out its deadline. The daemon exits 0, and its leases
// are back in Redis: what Redis has left is the limit less what was
// admitted.
func TestSIGTERMUnderLoad(t *testing.T) {
	srv := redistest.Standalone(t)
	const limit = 1_000_000
	cfg := fmt.Sprintf(`[store]
redis = [%q]
timeout = %q

[[rule]]
name = "term"
by = ["api_key"]
algorithm = "fixed_window"
limit = %d
period = "1h"
`, srv.Addr, fleetTimeout, limit)
	started := time.Now()
	p, err := daemontest.StartProcess(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)

	var answered, allowed, connErrs, timeouts, other atomic.Int64
	var firstOther atomic.Pointer[string]
	var wg sync.WaitGroup
	running := make(chan struct{})
	var once sync.Once
	for range 4 { // connections
		c := client.New(p.Socket)
		t.Cleanup(func() { c.Close() })
		for range 16 { // requests in flight on each
			wg.Go(func() {
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					r, err := c.Check(ctx, []client.Descriptor{{Name: "api_key", Value: "k"}}, 1)
					cancel()
					switch {
					case err == nil:
						answered.Add(1)
						if r.Allowed() {
							allowed.Add(1)
						}
						if answered.Load() > 2000 {
							once.Do(func() { close(running) })
						}
						continue
					case errors.Is(err, context.DeadlineExceeded):
						timeouts.Add(1)
					case errors.Is(err, client.ErrConnLost), isDialError(err):
						connErrs.Add(1)
					default:
						if other.Add(1) == 1 {
							msg := err.Error()
							firstOther.Store(&msg)
						}
					}
					return // the daemon is gone: stop, as a client would retry elsewhere
				}
			})
		}
	}
	<-running
	require.NoError(t, p.Term(10*time.Second), "rld exits 0 on SIGTERM\n%s", p.Logs())
	wg.Wait()
	t.Logf("answered %d (allowed %d), connection errors %d, timeouts %d, other errors %d",
		answered.Load(), allowed.Load(), connErrs.Load(), timeouts.Load(), other.Load())
	assert.Zero(t, timeouts.Load(), "a request vanished")
	if s := firstOther.Load(); s != nil {
		t.Errorf("unexpected error: %s", *s)
	}
	assert.Equal(t, answered.Load(), allowed.Load(), "the limit is far away")

	// The leases came back: Redis has the limit less what was admitted,
	// in the window (one hour) the test ran in.
	if started.Truncate(time.Hour) != time.Now().Truncate(time.Hour) {
		t.Skip("the run straddled the hour's window boundary")
	}
	c, err := redisx.New(context.Background(), redisx.Options{Addrs: []string{srv.Addr}, Timeout: time.Second, KeyPrefix: config.DefaultKeyPrefix})
	require.NoError(t, err)
	defer c.Close()
	params := algo.Params{Kind: algo.FixedWindow, Limit: limit, Period: time.Hour}
	r, err := redisx.NewStore(c).Take(context.Background(), counterKey("term", "k"), params, 1, time.Now(), true)
	require.NoError(t, err)
	left := r.Remaining + 1 // a peek's Remaining is after its cost of 1
	t.Logf("Redis has %d left of %d after %d admitted", left, limit, allowed.Load())
	// Requests that ended in a connection error may have been admitted
	// before their answer was lost: the client cannot know. Leases not
	// returned would show as far more missing (a lease holds about one
	// sync interval of the key's traffic: hundreds of units here).
	assert.LessOrEqual(t, left, limit-allowed.Load(), "more left than admitted")
	assert.GreaterOrEqual(t, left, limit-allowed.Load()-connErrs.Load(), "every lease was returned\n%s", p.Logs())
}

// isDialError reports whether err is the client's failure to connect to
// a daemon that has closed its socket.
func isDialError(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && !ne.Timeout()
}
