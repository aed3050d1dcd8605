package redisx_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/breaker"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

var (
	_ policy.Store = (*redisx.Store)(nil)
	_ policy.Store = (*memstore.Store)(nil)
)

var kinds = []algo.Kind{algo.TokenBucket, algo.GCRA, algo.SlidingLog, algo.SlidingCounter, algo.FixedWindow}

// testTimeout is the per-call timeout of the tests' clients: generous,
// since -race and a loaded two-core machine are slow; the default is
// checked by the daemon tests.
const testTimeout = 500 * time.Millisecond

// newClient returns a Client on the Redis at addrs, closed when t ends.
func newClient(t testing.TB, o redisx.Options) *redisx.Client {
	t.Helper()
	if o.Timeout == 0 {
		o.Timeout = testTimeout
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "t:"
	}
	c, err := redisx.New(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// TestStoreMatchesMemstore feeds the same random timelines (takes of
// various costs, peeks, refunds of earlier takes, cost above capacity),
// with explicit times, to the embedded store and to the Redis store, and
// demands identical Results.
func TestStoreMatchesMemstore(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	rs.UseCallerClock()
	ctx := context.Background()
	for _, k := range kinds {
		for _, burst := range []int64{0, 9} {
			if burst > 0 && k != algo.TokenBucket && k != algo.GCRA {
				continue
			}
			p := algo.Params{Kind: k, Limit: 5, Period: time.Second, Burst: burst}
			t.Run(fmt.Sprintf("%s/burst=%d", k, burst), func(t *testing.T) {
				ms := memstore.New(memstore.Options{})
				rng := rand.New(rand.NewPCG(uint64(k), uint64(burst)))
				key := []byte(fmt.Sprintf("diff\x00\x03k%s%d", k, burst))
				now := time.UnixMicro(time.Now().UnixMicro())
				type take struct {
					cost int64
					at   time.Time
				}
				var taken []take
				for step := range 300 {
					now = now.Add(time.Duration(rng.IntN(250_000)) * time.Microsecond)
					switch r := rng.IntN(10); {
					case r < 6: // take or peek
						cost := int64(1 + rng.IntN(3))
						if rng.IntN(20) == 0 {
							cost = p.Capacity() + 1
						}
						peek := r == 5
						want, err := ms.Take(ctx, key, p, cost, now, peek)
						require.NoError(t, err)
						got, err := rs.Take(ctx, key, p, cost, now, peek)
						require.NoError(t, err)
						require.Equal(t, want, got, "step %d: take cost %d peek %v at %d", step, cost, peek, now.UnixMicro())
						if got.Allowed && !peek {
							taken = append(taken, take{cost, time.UnixMicro(got.At)})
						}
					case r < 8 && len(taken) > 0: // refund an earlier take
						i := rng.IntN(len(taken))
						tk := taken[i]
						taken = append(taken[:i], taken[i+1:]...)
						require.NoError(t, ms.Refund(ctx, key, p, tk.cost, tk.at, now))
						require.NoError(t, rs.Refund(ctx, key, p, tk.cost, tk.at, now))
					default: // a zero cost counts as 1
						want, err := ms.Take(ctx, key, p, 0, now, false)
						require.NoError(t, err)
						got, err := rs.Take(ctx, key, p, 0, now, false)
						require.NoError(t, err)
						require.Equal(t, want, got, "step %d: take cost 0 at %d", step, now.UnixMicro())
						if got.Allowed {
							taken = append(taken, take{1, time.UnixMicro(got.At)})
						}
					}
				}
			})
		}
	}
}

// TestStoreRedisClock runs the same sequence on both stores with Redis's
// clock on one side and the local clock on the other: the counts agree
// (the times may differ by the microseconds between the two calls).
func TestStoreRedisClock(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			// An hour: no refill, window boundary or expiry worth a
			// unit happens during the test.
			p := algo.Params{Kind: k, Limit: 4, Period: time.Hour}
			ms := memstore.New(memstore.Options{})
			key := []byte("clock\x00\x01" + k.String())
			var msAt int64 // the embedded store's At of its first take
			check := func(what string, cost int64, peek bool) algo.Result {
				t.Helper()
				now := time.Now()
				want, err := ms.Take(ctx, key, p, cost, now, peek)
				require.NoError(t, err)
				if msAt == 0 && want.Allowed && !peek {
					msAt = want.At
				}
				got, err := rs.Take(ctx, key, p, cost, now, peek)
				require.NoError(t, err)
				assert.Equal(t, want.Allowed, got.Allowed, what)
				assert.Equal(t, want.Limit, got.Limit, what)
				assert.Equal(t, want.Remaining, got.Remaining, what)
				assert.Equal(t, want.RetryAfter == algo.Never, got.RetryAfter == algo.Never, what)
				assert.InDelta(t, float64(want.Reset), float64(got.Reset), float64(time.Second), what)
				assert.InDelta(t, float64(want.RetryAfter), float64(got.RetryAfter), float64(time.Second), what)
				assert.InDelta(t, float64(now.UnixMicro()), float64(got.At), float64(time.Second.Microseconds()), what+": At is Redis's clock")
				return got
			}
			check("peek on a fresh key", 1, true)
			first := check("take 1", 1, false)
			require.True(t, first.Allowed)
			check("take 2", 2, false)
			check("peek 2: does not fit", 2, true)
			check("take 2: denied", 2, false)
			check("cost above capacity", 5, false)
			// Each store refunds the take it made (sliding_log finds it
			// by its time).
			require.NoError(t, ms.Refund(ctx, key, p, 1, time.UnixMicro(msAt), time.Now()))
			require.NoError(t, rs.Refund(ctx, key, p, 1, time.UnixMicro(first.At), time.Now()))
			check("take 2 after the refund", 2, false)
			r := check("take 1: empty", 1, false)
			assert.False(t, r.Allowed)
			assert.Equal(t, int64(0), r.Remaining)
		})
	}
}

// TestBatchAndLease: TakeLease with want 0 takes a batch of costs in
// order, admitting the longest prefix that fits; Lease leases what is
// left, and Refund gives unused units back.
func TestBatchAndLease(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			p := algo.Params{Kind: k, Limit: 10, Period: time.Hour}
			key := []byte("batch\x00\x01" + k.String())
			n, leased, r, err := rs.TakeLease(ctx, key, p, []int64{3, 0, 3, 3, 1}, 0)
			require.NoError(t, err)
			assert.Zero(t, leased)
			assert.Equal(t, 4, n, "3+1+3+3 fit, the last 1 does not")
			assert.False(t, r.Allowed)
			assert.Equal(t, int64(0), r.Remaining)
			assert.Positive(t, r.RetryAfter)

			key = []byte("lease\x00\x01" + k.String())
			got, r, err := rs.Lease(ctx, key, p, 4)
			require.NoError(t, err)
			assert.Equal(t, int64(4), got)
			assert.Equal(t, int64(6), r.Remaining)
			got, r, err = rs.Lease(ctx, key, p, 100)
			require.NoError(t, err)
			assert.Equal(t, int64(6), got, "a lease grants what is left")
			assert.True(t, r.Allowed)
			got, r, err = rs.Lease(ctx, key, p, 1)
			require.NoError(t, err)
			assert.Equal(t, int64(0), got)
			assert.False(t, r.Allowed)
			// Unused lease units go back with Refund.
			require.NoError(t, rs.Refund(ctx, key, p, 2, time.UnixMicro(r.At), time.Now()))
			if k == algo.SlidingLog {
				// The log refunds the entry taken at takenAt: the
				// second lease's.
				res, err := rs.Take(ctx, key, p, 1, time.Now(), true)
				require.NoError(t, err)
				t.Logf("sliding log after a refund at the wrong time: remaining %d", res.Remaining)
				return
			}
			res, err := rs.Take(ctx, key, p, 2, time.Now(), false)
			require.NoError(t, err)
			assert.True(t, res.Allowed, "the refunded units are back")
		})
	}
}

func TestKeyFormat(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, KeyPrefix: "p:"}))
	key := []byte("rule\x00\x05a}{\r\n")
	p := algo.Params{Kind: algo.GCRA, Limit: 3, Period: time.Minute}
	_, err := rs.Take(context.Background(), key, p, 1, time.Now(), false)
	require.NoError(t, err)
	want := string(redisx.AppendKey(nil, "p:", key, algo.GCRA))
	assert.Equal(t, "p:{rule\x00\x05a}{\r\n}:gcra", want)
	n, err := redistest.Do(srv.Addr, "EXISTS", want)
	require.NoError(t, err)
	assert.Equal(t, "1", n, "binary-safe key")
	ttl, err := redistest.Do(srv.Addr, "PTTL", want)
	require.NoError(t, err)
	assert.NotEqual(t, "-1", ttl, "the script sets a TTL")
	t.Logf("PTTL of a GCRA 3/min key after one take: %s ms", ttl)
}

// TestScriptCacheLoss flushes the script cache and restarts Redis under a
// running Store: calls after the flush and after the restart succeed
// (EVALSHA falls back to EVAL), and calls fail only while Redis is down.
func TestScriptCacheLoss(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()
	take := func(k algo.Kind) error {
		_, err := rs.Take(ctx, []byte("flush"), algo.Params{Kind: k, Limit: 1000, Period: time.Second}, 1, time.Now(), false)
		return err
	}
	for _, k := range kinds {
		require.NoError(t, take(k))
	}
	_, err := redistest.Do(srv.Addr, "SCRIPT", "FLUSH")
	require.NoError(t, err)
	for _, k := range kinds {
		require.NoError(t, take(k), "%s after SCRIPT FLUSH", k)
	}

	srv.Kill()
	assert.Error(t, take(algo.TokenBucket), "redis is down")
	srv.Start(t)
	// Every call after the restart succeeds, the first one included:
	// the connections that broke were noticed when Redis went away.
	for i := range 20 {
		for _, k := range kinds {
			require.NoError(t, take(k), "%s, call %d after the restart", k, i)
		}
	}
}

// TestStartWhileRedisDown: a Client made while Redis is down fails calls
// fast and works once Redis is up, in every mode's connect path.
func TestStartWhileRedisDown(t *testing.T) {
	for _, mode := range []redisx.Mode{redisx.Standalone, redisx.Cluster} {
		t.Run(string(mode), func(t *testing.T) {
			srv := redistest.Standalone(t)
			srv.Kill()
			c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}, Mode: mode})
			rs := redisx.NewStore(c)
			p := algo.Params{Limit: 10, Period: time.Second}
			start := time.Now()
			_, err := rs.Take(context.Background(), []byte("k"), p, 1, time.Now(), false)
			require.Error(t, err)
			assert.Less(t, time.Since(start), testTimeout, "fails fast")
			assert.Error(t, c.Ping(context.Background()))

			srv.Start(t)
			redistest.WaitFor(t, "the store to reach redis", func() bool {
				_, err := rs.Take(context.Background(), []byte("k"), p, 1, time.Now(), false)
				return err == nil
			})
		})
	}
}

func TestNewRejects(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	_, err := redistest.Do(srv.Addr, "CONFIG", "SET", "requirepass", "secret")
	require.NoError(t, err)
	_, err = redisx.New(ctx, redisx.Options{Addrs: []string{srv.Addr}, Password: "wrong"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "refused the connection")
	c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}, Password: "secret"})
	require.NoError(t, c.Ping(ctx))

	for _, o := range []redisx.Options{
		{},
		{Addrs: []string{"a:1", "b:2"}},
		{Addrs: []string{"a:1"}, Mode: redisx.Sentinel},
		{Addrs: []string{"a:1"}, MasterSet: "m"},
		{Addrs: []string{"a:1"}, Mode: "ring"},
		{Addrs: []string{"a:1"}, KeyPrefix: "{x}"},
		{Addrs: []string{"a:1"}, PipelineMultiplex: 9},
	} {
		_, err := redisx.New(ctx, o)
		assert.Error(t, err, "%+v", o)
	}
}

func TestClosedClient(t *testing.T) {
	srv := redistest.Standalone(t)
	c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}})
	c.Close()
	c.Close()
	_, err := redisx.NewStore(c).Take(context.Background(), []byte("k"), algo.Params{Limit: 1, Period: time.Second}, 1, time.Now(), false)
	assert.ErrorIs(t, err, redisx.ErrClosed)
	assert.True(t, strings.HasPrefix(err.Error(), `redisx: take "t:{k}:tb": `), err.Error())
}

// TestCloseLeavesNoGoroutines: Close stops every goroutine a Client
// started, connected or still connecting.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	srv := redistest.Standalone(t)
	down := redistest.Standalone(t)
	down.Kill()
	base := runtime.NumGoroutine()
	for _, o := range []redisx.Options{
		{Addrs: []string{srv.Addr}},
		{Addrs: []string{down.Addr}, Mode: redisx.Cluster}, // connecting in the background
	} {
		c, err := redisx.New(context.Background(), o)
		require.NoError(t, err)
		rs := redisx.NewStore(c)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				_, _ = rs.Take(context.Background(), []byte("k"), algo.Params{Limit: 100, Period: time.Second}, 1, time.Now(), false)
			})
		}
		wg.Wait()
		c.Close()
	}
	redistest.WaitFor(t, "the clients' goroutines to end", func() bool { return runtime.NumGoroutine() <= base })
}

// TestPausedRedisFailsFast: with Redis frozen (SIGSTOP), calls fail
// within about their timeout instead of blocking (the first few time
// out; then the circuit breaker opens and refuses the others at once),
// and succeed again once Redis resumes.
func TestPausedRedisFailsFast(t *testing.T) {
	srv := redistest.Standalone(t)
	const timeout = 20 * time.Millisecond
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, Timeout: timeout}))
	p := algo.Params{Limit: 1_000_000, Period: time.Second}
	take := func() error {
		_, err := rs.Take(context.Background(), []byte("paused"), p, 1, time.Now(), false)
		return err
	}
	redistest.WaitFor(t, "a first call within the timeout", func() bool { return take() == nil })

	srv.Pause()
	defer srv.Resume()
	var wg sync.WaitGroup
	for range 3 { // before and after rueidis gives up on the connection
		for range 10 {
			wg.Go(func() {
				start := time.Now()
				err := take()
				if !errors.Is(err, breaker.ErrOpen) {
					assert.ErrorIs(t, err, context.DeadlineExceeded)
				}
				// Slack for -race on a loaded machine; the point is
				// milliseconds, not the seconds of rueidis's defaults.
				assert.Less(t, time.Since(start), timeout+200*time.Millisecond)
			})
		}
		wg.Wait()
		time.Sleep(300 * time.Millisecond) // let time pass while paused
	}
	srv.Resume()
	redistest.WaitFor(t, "calls to succeed after resume", func() bool { return take() == nil })
}

func TestTakeLease(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()
	for _, k := range kinds {
		t.Run(k.String(), func(t *testing.T) {
			// An hour: nothing refills during the test.
			p := algo.Params{Kind: k, Limit: 10, Period: time.Hour}
			key := []byte("takelease\x00\x01" + k.String())
			check := func(costs []int64, want int64, wantN int, wantL, wantRemaining int64, allowed bool) algo.Result {
				t.Helper()
				n, l, r, err := rs.TakeLease(ctx, key, p, costs, want)
				require.NoError(t, err)
				assert.Equal(t, wantN, n, "admitted of %v, want %d", costs, want)
				assert.Equal(t, wantL, l, "leased of %v, want %d", costs, want)
				assert.Equal(t, wantRemaining, r.Remaining, "remaining of %v, want %d", costs, want)
				assert.Equal(t, allowed, r.Allowed, "allowed of %v, want %d", costs, want)
				assert.Equal(t, p.Limit, r.Limit)
				return r
			}
			check([]int64{2}, 0, 1, 0, 8, true)           // want 0: no lease
			check([]int64{2}, -5, 1, 0, 6, true)          // below 0 counts as 0
			r := check([]int64{2, 11}, 5, 1, 0, 4, false) // a denial: no lease
			assert.Equal(t, algo.Never, r.RetryAfter)
			r = check([]int64{0, 1}, 1, 2, 1, 1, true) // a cost of 0 counts as 1
			assert.Zero(t, r.RetryAfter)
			check([]int64{1}, 100, 1, 0, 0, true) // the take empties it: nothing left to lease
			r = check([]int64{1}, 100, 0, 0, 0, false)
			assert.Positive(t, r.RetryAfter)

			// A denial on a fresh key writes nothing.
			fresh := []byte("takelease-fresh\x00" + k.String())
			n, l, _, err := rs.TakeLease(ctx, fresh, p, []int64{11}, 3)
			require.NoError(t, err)
			assert.Equal(t, 0, n)
			assert.Zero(t, l)
			exists, err := redistest.Do(srv.Addr, "EXISTS", string(redisx.AppendKey(nil, "t:", fresh, k)))
			require.NoError(t, err)
			assert.Equal(t, "0", exists)

			// No costs: a lease, or nothing.
			n, l, r, err = rs.TakeLease(ctx, fresh, p, nil, 0)
			require.NoError(t, err)
			assert.True(t, r.Allowed)
			assert.Equal(t, 0, n)
			assert.Zero(t, l)
			n, l, r, err = rs.TakeLease(ctx, fresh, p, nil, 3)
			require.NoError(t, err)
			assert.Equal(t, 0, n)
			assert.Equal(t, int64(3), l)
			assert.Equal(t, int64(7), r.Remaining)

			// Three costs and a lease in one call against the same
			// sequence in algo.
			p2 := algo.Params{Kind: k, Limit: 20, Period: time.Hour, Burst: 25}
			key2 := []byte("takelease-algo\x00" + k.String())
			var st algo.State
			for i, c := range [][]int64{{3, 4, 5}, {2}, {9, 9}, {1, 1, 1}} {
				n, l, r, err := rs.TakeLease(ctx, key2, p2, c, 4)
				require.NoError(t, err)
				wn, wl, wr := algo.TakeLease(p2, &st, r.At, c, 4)
				assert.Equal(t, wn, n, "call %d", i)
				assert.Equal(t, wl, l, "call %d", i)
				assert.Equal(t, wr.Allowed, r.Allowed, "call %d", i)
				assert.Equal(t, wr.Remaining, r.Remaining, "call %d", i)
			}
		})
	}
}
