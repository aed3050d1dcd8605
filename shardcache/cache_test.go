package shardcache_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

var ctx = context.Background()

// cachedKinds are the algorithms a cached rule may use.
var cachedKinds = []algo.Kind{algo.TokenBucket, algo.GCRA, algo.FixedWindow, algo.SlidingCounter}

// TestHotKeyIsLocal: a key well under its limit is decided on the host;
// the store sees at most 0.02 calls per check, syncs included.
func TestHotKeyIsLocal(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second})
			l := newLoops(b.clk, shardcache.DefaultSyncInterval, c)
			// An hour: no window ends during the test (near its end a
			// window's checks go to the store, by design).
			p := algo.Params{Kind: k, Limit: 1_000_000, Period: time.Hour}
			const checks = 20_000
			for i := range checks {
				r, err := c.Take(ctx, []byte("hot"), p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed, "check %d: %+v", i, r)
				l.advance(100 * time.Microsecond) // 1,000 checks per sync interval
			}
			calls := b.calls.Load() + b.syncOps.Load()
			t.Logf("%s: %d checks, %d store calls + %d sync ops", k, checks, b.calls.Load(), b.syncOps.Load())
			assert.LessOrEqual(t, float64(calls)/checks, 0.02)
		})
	}
}

// bound is the most a limit can admit over [from, to] (store µs): the
// capacity and the refill for the buckets, the limit per window touched
// for the windows.
func bound(p algo.Params, from, to int64) int64 {
	per := p.PeriodMicros()
	switch p.Kind {
	case algo.TokenBucket, algo.GCRA:
		return p.Capacity() + (to-from)*p.Limit/per
	default:
		return p.Limit * (to/per - from/per + 1)
	}
}

// drive runs each of checks in a loop on a goroutine of its own, perStep
// checks in all at each time of the clock: when they have made them, the
// clock moves step on, running l's ticks on the way. When it has moved
// d, drive stops them. Each call of a check is one check.
func drive(l *loops, d, step time.Duration, perStep int64, checks ...func()) {
	var budget, done atomic.Int64 // checks left to start, and made, at this time
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, check := range checks {
		wg.Go(func() {
			for !stop.Load() {
				if budget.Add(-1) < 0 {
					runtime.Gosched() // polling for the next step
					continue
				}
				check()
				done.Add(1)
			}
		})
	}
	end := l.clk.Now().Add(d)
	for l.clk.Now().Before(end) {
		done.Store(0)
		budget.Store(perStep)
		for done.Load() < perStep {
			runtime.Gosched() // polling the checks' count
		}
		l.advance(step)
	}
	stop.Store(true)
	wg.Wait()
}

// hammer checks key through each cache from workers goroutines each, as
// fast as they can, while the clock moves for d (see drive: a step of
// 100 µs every 10 checks), and returns the admissions and denials.
func hammer(l *loops, caches []*shardcache.Cache, workers int, key string, p algo.Params, d time.Duration) (admitted, denied int64) {
	var a, n atomic.Int64
	var checks []func()
	for _, c := range caches {
		for range workers {
			checks = append(checks, func() {
				r, err := c.Take(ctx, []byte(key), p, 1, l.clk.Now(), false)
				switch {
				case err != nil:
				case r.Allowed:
					a.Add(1)
				default:
					n.Add(1)
				}
			})
		}
	}
	drive(l, d, 100*time.Microsecond, 10, checks...)
	return a.Load(), n.Load()
}

// TestNeverOverLimit: three caches on one store, each with its sync loop,
// hammer one key far over its limit; the fleet admits at most the
// algorithm's exact bound. One cache then stops dead with its leases,
// as a SIGKILLed daemon would: still at most the bound.
func TestNeverOverLimit(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Parallel()
			b := newAlgoBackend()
			var caches []*shardcache.Cache
			o := shardcache.Options{SyncInterval: 10 * time.Millisecond, Timeout: time.Second, Peers: func() int { return 3 }}
			for range 3 {
				caches = append(caches, newCache(b, b.clk, o))
			}
			l := newLoops(b.clk, o.SyncInterval, caches...)
			p := algo.Params{Kind: k, Limit: 200, Period: 100 * time.Millisecond}
			from := b.clk.Now().UnixMicro()
			admitted, denied := hammer(l, caches, 4, "k", p, 400*time.Millisecond)
			// The second half: one cache is dead, its leases never returned.
			l.caches = caches[1:]
			a2, d2 := hammer(l, caches[1:], 4, "k", p, 300*time.Millisecond)
			to := b.clk.Now().UnixMicro()
			admitted += a2
			denied += d2
			max := bound(p, from, to)
			t.Logf("%s: admitted %d of bound %d (%.2f), denied %d", k, admitted, max, float64(admitted)/float64(max), denied)
			assert.LessOrEqual(t, admitted, max)
			assert.Greater(t, denied, admitted, "the key was hammered")
		})
	}
}

// TestWindowLeaseStaysInItsWindow: with a fixed window, no window admits
// more than the limit, though leases are taken close to its end.
func TestWindowLeaseStaysInItsWindow(t *testing.T) {
	b := newAlgoBackend()
	p := algo.Params{Kind: algo.FixedWindow, Limit: 100, Period: 50 * time.Millisecond}
	per := p.PeriodMicros()
	o := shardcache.Options{SyncInterval: 10 * time.Millisecond, Timeout: time.Second, Peers: func() int { return 3 }}
	var caches []*shardcache.Cache
	for range 3 {
		caches = append(caches, newCache(b, b.clk, o))
	}
	l := newLoops(b.clk, o.SyncInterval, caches...)
	var mu sync.Mutex
	perWindow := map[int64]int64{} // admissions known to lie in the window
	ambiguous := 0                 // admissions whose call spanned a window's end
	var checks []func()
	for _, c := range caches {
		for range 3 {
			checks = append(checks, func() {
				before := b.clk.Now()
				r, err := c.Take(ctx, []byte("w"), p, 1, before, false)
				after := b.clk.Now().UnixMicro()
				if err != nil || !r.Allowed {
					return
				}
				mu.Lock()
				if w := before.UnixMicro() / per; w == after/per {
					perWindow[w]++
				} else {
					ambiguous++
				}
				mu.Unlock()
			})
		}
	}
	drive(l, 500*time.Millisecond, 100*time.Microsecond, 10, checks...)
	for w, n := range perWindow {
		assert.LessOrEqual(t, n, p.Limit, "window %d", w)
	}
	assert.Len(t, perWindow, 10, "ten windows, each with admissions")
	t.Logf("admitted per window: %v (%d across a boundary)", perWindow, ambiguous)
}

// TestNotUnderLimit: a client at 80%% of its limit, spread evenly over
// three caches, is never refused.
func TestNotUnderLimit(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			o := shardcache.Options{SyncInterval: 20 * time.Millisecond, Timeout: time.Second, Peers: func() int { return 3 }}
			var caches []*shardcache.Cache
			for range 3 {
				caches = append(caches, newCache(b, b.clk, o))
			}
			l := newLoops(b.clk, o.SyncInterval, caches...)
			// 10,000 checks at 80% of 20,000/s, evenly spaced.
			p := algo.Params{Kind: k, Limit: 2_000, Period: 100 * time.Millisecond}
			const checks = 10_000
			interval := time.Duration(float64(p.Period) / float64(p.Limit) / 0.8)
			refused := 0
			for i := range checks {
				r, err := caches[i%3].Take(ctx, []byte("steady"), p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				if !r.Allowed {
					refused++
				}
				l.advance(interval)
			}
			t.Logf("%s: %d checks, %d refused, %d store calls, %d sync ops", k, checks, refused, b.calls.Load(), b.syncOps.Load())
			assert.Zero(t, refused)
		})
	}
}

// TestMovingClientGetsQuota: a client that used one daemon, then moves to
// another, gets the first one's unused lease within two sync intervals:
// the first daemon returns it within one interval of the client's last
// check there, and the second learns of it when its denial, at most an
// interval long, ends. On the fake clock the bound is exact.
func TestMovingClientGetsQuota(t *testing.T) {
	b := newAlgoBackend()
	o := shardcache.Options{SyncInterval: 50 * time.Millisecond, Timeout: time.Second, Peers: func() int { return 2 }}
	a, other := newCache(b, b.clk, o), newCache(b, b.clk, o)
	l := newLoops(b.clk, o.SyncInterval, a, other)
	p := algo.Params{Kind: algo.FixedWindow, Limit: 100, Period: time.Hour}
	var onA atomic.Int64
	for range 60 { // a hot key: a leases ahead
		if r, err := a.Take(ctx, []byte("mover"), p, 1, b.clk.Now(), false); err == nil && r.Allowed {
			onA.Add(1)
		}
	}
	require.Equal(t, int64(60), onA.Load())
	left := b.remaining("mover", p)
	t.Logf("after 60 checks on a, the store has %d left: a holds the rest of 40", left)
	require.Less(t, left, int64(40), "a holds a lease")

	// The client moves, and keeps asking until it has the whole limit.
	movedAt := b.clk.Now()
	onOther := int64(0)
	for onA.Load()+onOther < p.Limit {
		waited := b.clk.Now().Sub(movedAt)
		require.LessOrEqual(t, waited, 2*o.SyncInterval, "other got %d of the 40 left", onOther)
		r, err := other.Take(ctx, []byte("mover"), p, 1, b.clk.Now(), false)
		require.NoError(t, err)
		if r.Allowed {
			onOther++
			l.advance(time.Millisecond) // the client's pace
			continue
		}
		require.Positive(t, r.RetryAfter)
		require.LessOrEqual(t, r.RetryAfter, o.SyncInterval, "a denial that may be a's lease lasts one sync interval at most")
		l.advance(r.RetryAfter) // the client honours Retry-After
	}
	t.Logf("other got the remaining %d within %v (sync interval %v)", onOther, b.clk.Now().Sub(movedAt), o.SyncInterval)
}

// TestHammeredKeyCostsOneCallPerRetry: a key checked at far more than its
// limit costs the store about one call per retry-after, however many
// checks arrive.
func TestHammeredKeyCostsOneCallPerRetry(t *testing.T) {
	b := newAlgoBackend()
	o := shardcache.Options{SyncInterval: 10 * time.Millisecond, Timeout: time.Second}
	c := newCache(b, b.clk, o)
	l := newLoops(b.clk, o.SyncInterval, c)
	p := algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: 200 * time.Millisecond}
	// Start on a window boundary, so that the run covers whole windows.
	b.clk.set(b.clk.Now().Truncate(p.Period))
	const windows = 5
	admitted, denied := hammer(l, []*shardcache.Cache{c}, 4, "abuser", p, windows*p.Period)
	t.Logf("%d admitted, %d denied over %d windows: %d store calls, %d sync ops", admitted, denied, windows, b.calls.Load(), b.syncOps.Load())
	assert.LessOrEqual(t, admitted, int64(windows+1)*p.Limit)
	assert.Greater(t, denied, 100*admitted/10, "hammered")
	// Per window: the call that takes the lease (or the limit), the one
	// that learns the denial, and a slack of two for the boundary.
	assert.LessOrEqual(t, b.calls.Load(), int64(windows+1)*4)
}

// TestStrictCoalesces: strict checks of one key never use a lease (the
// syncs that follow have nothing to return or renew), and concurrent ones
// share store calls.
func TestStrictCoalesces(t *testing.T) {
	b := newAlgoBackend()
	slow := &slowBackend{algoBackend: b, delay: 200 * time.Microsecond}
	c := newCache(slow, b.clk, shardcache.Options{Timeout: time.Second})
	s := c.Strict()
	p := algo.Params{Kind: algo.SlidingLog, Limit: 1000, Period: time.Hour}
	var wg sync.WaitGroup
	var admitted atomic.Int64
	const workers, each = 32, 50
	for range workers {
		wg.Go(func() {
			for range each {
				r, err := s.Take(ctx, []byte("strict"), p, 1, b.clk.Now(), false)
				if err == nil && r.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	calls := b.calls.Load()
	t.Logf("%d strict checks, %d store calls: %.1f checks per call", workers*each, calls, float64(workers*each)/float64(calls))
	assert.Equal(t, p.Limit, admitted.Load(), "exactly the limit")
	assert.Less(t, calls, int64(workers*each/2))
	// What a sync loop would do next finds nothing to return or renew.
	l := newLoops(b.clk, shardcache.DefaultSyncInterval, c)
	l.advance(3 * shardcache.DefaultSyncInterval)
	require.NoError(t, c.Close(ctx))
	assert.Zero(t, b.syncOps.Load(), "no lease to return or renew")
	assert.Zero(t, c.Len(), "no entry")
}

// slowBackend adds a delay to every call, as a network would.
type slowBackend struct {
	*algoBackend
	delay time.Duration
}

func (s *slowBackend) TakeLease(ctx context.Context, key []byte, p algo.Params, costs []int64, want int64) (int, int64, algo.Result, error) {
	time.Sleep(s.delay)
	return s.algoBackend.TakeLease(ctx, key, p, costs, want)
}

// TestCloseReturnsLeases: Close gives every unused unit back.
func TestCloseReturnsLeases(t *testing.T) {
	b := newAlgoBackend()
	c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10 {
				_, err := c.Take(ctx, []byte("k"), p, 1, b.clk.Now(), false)
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.Less(t, b.remaining("k", p), int64(1000-80), "leased ahead")
	require.NoError(t, c.Close(ctx))
	assert.Equal(t, int64(1000-80), b.remaining("k", p), "only what was admitted is gone")
	_, err := c.Take(ctx, []byte("k"), p, 1, b.clk.Now(), false)
	assert.ErrorIs(t, err, shardcache.ErrClosed)
}

// TestRefundGoesToLease: a refund of a locally admitted unit goes back to
// the lease, with no store call.
func TestRefundGoesToLease(t *testing.T) {
	b := newAlgoBackend()
	c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
	for range 4 {
		_, err := c.Take(ctx, []byte("k"), p, 1, b.clk.Now(), false)
		require.NoError(t, err)
	}
	r, err := c.Take(ctx, []byte("k"), p, 1, b.clk.Now(), false)
	require.NoError(t, err)
	calls := b.calls.Load()
	require.NoError(t, c.Refund(ctx, []byte("k"), p, 1, time.UnixMicro(r.At), b.clk.Now()))
	assert.Equal(t, calls, b.calls.Load(), "refunded locally")
	require.NoError(t, c.Close(ctx))
	assert.Equal(t, int64(1000-4), b.remaining("k", p))
}

// TestSyncEvictsIdle: entries idle for two syncs go, and their leases
// with them; MaxEntries bounds the cache.
func TestSyncEvictsIdle(t *testing.T) {
	b := newAlgoBackend()
	c := newCache(b, b.clk, shardcache.Options{MaxEntries: 100, Timeout: time.Second})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
	for i := range 1000 {
		_, err := c.Take(ctx, fmt.Appendf(nil, "k%d", i), p, 1, b.clk.Now(), false)
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, c.Len(), 100+shardcache.DefaultShards)
	for range 3 {
		b.clk.set(b.clk.Now().Add(shardcache.DefaultSyncInterval))
		c.Sync(b.clk.Now())
	}
	assert.Zero(t, c.Len())
	for i := range 1000 {
		assert.Equal(t, int64(999), b.remaining(fmt.Sprintf("k%d", i), p), "key %d: every lease came back", i)
	}
}

// TestSyncSendsSmallCalls: a tick sends its ops in calls of SendChunk
// ops, so that a check written to the same Redis connection behind a
// sync call waits for a few script calls, not hundreds; a tick with
// more ops than SendChunk × SendCalls makes SendCalls larger calls, so
// that it ends within that many round trips. Every lease comes back.
func TestSyncSendsSmallCalls(t *testing.T) {
	for _, n := range []int{100, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b := newAlgoBackend()
			c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second})
			p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
			for i := range n {
				_, err := c.Take(ctx, fmt.Appendf(nil, "k%d", i), p, 1, b.clk.Now(), false)
				require.NoError(t, err)
			}
			biggest := int64(0)
			for range 3 {
				b.clk.set(b.clk.Now().Add(shardcache.DefaultSyncInterval))
				calls, ops := b.syncs.Load(), b.syncOps.Load()
				c.Sync(b.clk.Now())
				calls, ops = b.syncs.Load()-calls, b.syncOps.Load()-ops
				assert.LessOrEqual(t, calls, int64(shardcache.SendCalls), "calls in one tick of %d ops", ops)
				biggest = max(biggest, ops)
			}
			assert.GreaterOrEqual(t, b.syncOps.Load(), int64(n), "a return per lease")
			want := max(int64(shardcache.SendChunk), (biggest+shardcache.SendCalls-1)/shardcache.SendCalls)
			assert.LessOrEqual(t, b.maxSyncOps.Load(), want, "ops in one call, the biggest tick %d ops", biggest)
			if n <= shardcache.SendChunk*shardcache.SendCalls {
				assert.LessOrEqual(t, b.maxSyncOps.Load(), int64(shardcache.SendChunk))
			}
			for i := range n {
				assert.Equal(t, int64(999), b.remaining(fmt.Sprintf("k%d", i), p), "key %d: its lease came back", i)
			}
		})
	}
}

// TestStoreErrorIsReturned: a failing store call fails the checks that
// needed it, and the next call works.
func TestStoreErrorIsReturned(t *testing.T) {
	b := newAlgoBackend()
	c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Hour}
	b.failNext.Store(true)
	_, err := c.Take(ctx, []byte("k"), p, 1, b.clk.Now(), false)
	require.Error(t, err)
	r, err := c.Take(ctx, []byte("k"), p, 1, b.clk.Now(), false)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
}

// TestBytesPerEntry measures the memory an entry costs: 100,000 keys of
// 24 bytes, each with a lease, against a store that keeps nothing.
func TestBytesPerEntry(t *testing.T) {
	const n = 100_000
	clk := newFakeClock()
	c := newCache(grantAll{clk}, clk, shardcache.Options{MaxEntries: n, Timeout: time.Second})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Second}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "api_key:%015d", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, k := range keys {
		_, err := c.Take(ctx, k, p, 1, clk.Now(), false)
		require.NoError(t, err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	require.Equal(t, n, c.Len())
	perEntry := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.0f bytes per entry (key of %d bytes included)", perEntry, len(keys[0]))
	assert.Less(t, perEntry, 400.0)
	runtime.KeepAlive(keys)
}

// grantAll is a store that admits everything and keeps no state.
type grantAll struct{ clk *fakeClock }

func (grantAll) Take(context.Context, []byte, algo.Params, int64, time.Time, bool) (algo.Result, error) {
	return algo.Result{Allowed: true}, nil
}
func (grantAll) Refund(context.Context, []byte, algo.Params, int64, time.Time, time.Time) error {
	return nil
}
func (g grantAll) TakeLease(_ context.Context, _ []byte, p algo.Params, costs []int64, want int64) (int, int64, algo.Result, error) {
	return len(costs), want, algo.Result{Allowed: true, Limit: p.Capacity(), Remaining: p.Capacity(), At: g.clk.Now().UnixMicro()}, nil
}
func (grantAll) Sync(context.Context, []algo.Op) error { return nil }

// TestKnown: the cache reports what it last knew of a key's remaining
// quota in the store: nothing for a key never answered, the store's
// remainder without the cache's own lease, less than the denied cost
// while a denial holds.
func TestKnown(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second})
			p := algo.Params{Kind: k, Limit: 100, Period: time.Hour}
			_, ok := c.Known([]byte("k"), p, b.clk.Now())
			assert.False(t, ok, "never answered")
			r, err := c.Take(ctx, []byte("k"), p, 10, b.clk.Now(), false)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			got, ok := c.Known([]byte("k"), p, b.clk.Now())
			require.True(t, ok)
			assert.Equal(t, b.remaining("k", p), got, "the store's remainder, the lease left out")
			_, ok = c.Known([]byte("k"), algo.Params{Kind: k, Limit: 50, Period: time.Hour}, b.clk.Now())
			assert.False(t, ok, "another limit")

			// Use it up: denied, and known as used up.
			for i := 0; ; i++ {
				require.Less(t, i, 1000)
				r, err := c.Take(ctx, []byte("k"), p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				if !r.Allowed {
					break
				}
			}
			got, ok = c.Known([]byte("k"), p, b.clk.Now())
			require.True(t, ok)
			assert.Zero(t, got, "a key the store refused")
		})
	}
}

// TestPeeksAreRememberedAndCoalesced: concurrent peeks of a key share one
// store call, and its answer is kept: for a sync interval for a plain
// peek, for the denial's retry-after for a denial's peek; a peek the
// store denies is remembered as a take's denial is.
func TestPeeksAreRememberedAndCoalesced(t *testing.T) {
	b := newAlgoBackend()
	c := newCache(b, b.clk, shardcache.Options{SyncInterval: time.Hour, Timeout: time.Second})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
	now := b.clk.Now()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				r, err := c.PeekForDenial(ctx, []byte("tenant"), p, 1, now, time.Minute)
				assert.NoError(t, err)
				assert.True(t, r.Allowed)
				assert.Equal(t, int64(999), r.Remaining)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(1), b.calls.Load(), "1,600 denial peeks: one store call")
	r, err := c.Take(ctx, []byte("tenant"), p, 1, now, true)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(1), b.calls.Load(), "a plain peek within the sync interval: no call")

	// A peek whose cost does not fit asks the store, and its denial is
	// kept like a take's.
	small := algo.Params{Kind: algo.TokenBucket, Limit: 2, Period: time.Hour}
	for range 2 {
		_, err := c.Take(ctx, []byte("full"), small, 1, now, false)
		require.NoError(t, err)
	}
	calls := b.calls.Load()
	for range 10 {
		r, err := c.Take(ctx, []byte("full"), small, 1, now, true)
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Positive(t, r.RetryAfter)
	}
	assert.LessOrEqual(t, b.calls.Load()-calls, int64(1), "ten denied peeks: one store call at most")
}

// TestHammeredBucketCostsOneCallPerHold: a bucket checked through three
// caches at 300× its limit is admitted about its whole rate, never more
// than its exact bound, at a few store calls per cache per hold (see
// Cache's refillHold: three sync intervals here, or the refill of half
// the capacity when that is shorter), where its exact retry-after cost
// 3.5–3.9 calls per unit admitted (measured before the holds: each
// refilled unit is a call that takes it and a call that finds it gone,
// from each cache). A small burst, which shortens the hold, loses none
// of the refill to a full bucket either.
func TestHammeredBucketCostsOneCallPerHold(t *testing.T) {
	for _, tc := range []struct {
		kind    algo.Kind
		burst   int64
		perUnit float64 // the most store calls per unit admitted
	}{
		{algo.TokenBucket, 0, 0.5}, {algo.GCRA, 0, 0.5}, // measured 0.31–0.32
		{algo.TokenBucket, 10, 2}, {algo.GCRA, 10, 2}, // a hold of 5 ms: 1.24–1.28
	} {
		t.Run(fmt.Sprintf("%s/burst=%d", tc.kind, tc.burst), func(t *testing.T) {
			t.Parallel()
			b := newAlgoBackend()
			o := shardcache.Options{SyncInterval: 10 * time.Millisecond, Timeout: time.Second, Peers: func() int { return 3 }}
			var caches []*shardcache.Cache
			for range 3 {
				caches = append(caches, newCache(b, b.clk, o))
			}
			l := newLoops(b.clk, o.SyncInterval, caches...)
			// 1 unit per ms, offered 100,000 checks/s.
			p := algo.Params{Kind: tc.kind, Limit: 100, Period: 100 * time.Millisecond, Burst: tc.burst}
			from := b.clk.Now().UnixMicro()
			admitted, denied := hammer(l, caches, 4, "abuser", p, time.Second)
			max := bound(p, from, b.clk.Now().UnixMicro())
			calls := b.calls.Load()
			t.Logf("admitted %d of bound %d (%.3f), denied %d: %d store calls (%.2f per admitted unit), %d sync ops",
				admitted, max, float64(admitted)/float64(max), denied, calls, float64(calls)/float64(admitted), b.syncOps.Load())
			assert.LessOrEqual(t, admitted, max)
			// The last hold's refill (30 units) is not taken yet when
			// the run ends.
			assert.Greater(t, float64(admitted), 0.95*float64(max), "the key gets its rate")
			assert.LessOrEqual(t, float64(calls), tc.perUnit*float64(admitted))
		})
	}
}
