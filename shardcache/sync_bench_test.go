package shardcache_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// warmCache returns a cache of daemon "a" holding n keys, each checked
// twice (a warm lease with one unit spent, as a key of a long tail holds
// after a few checks), on b, and the keys.
func warmCache(tb testing.TB, b *algoBackend, n int) (*shardcache.Cache, [][]byte) {
	tb.Helper()
	c := newCache(b, b.clk, shardcache.Options{
		MaxEntries: 2 * n, Timeout: time.Minute, Holder: "a", Peers: func() int { return 1 },
		Recall: func(context.Context, []byte, algo.Kind) error { return nil },
	})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000_000, Period: time.Second}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "api_key=k%d endpoint=/v1/search", i)
		for range 2 {
			if _, err := c.Take(ctx, keys[i], p, 1, b.clk.Now(), false); err != nil {
				tb.Fatal(err)
			}
		}
	}
	return c, keys
}

// BenchmarkSync100k times one Sync and one ReturnIdle of a cache holding
// 100,000 warm leases, none of which needs an op: the cost of a tick of
// the sync loop on a daemon that serves a long tail of keys, which the
// loop pays twice per sync interval; and a Sync after 1,000 of the keys
// saw a check (untimed), which leaves them out: their warm leases hold
// far more than their traffic (see quiet). Each iteration is the next tick
// (half an interval later), over 20 s of ticks and then again from the
// start: run it with -benchtime 200x (10 s) to keep every lease far
// from its lifetime's end.
func BenchmarkSync100k(b *testing.B) {
	for _, tc := range []struct {
		name    string
		run     func(*shardcache.Cache, time.Time) int
		checked int // keys checked before each tick, untimed
	}{
		{"Sync", (*shardcache.Cache).Sync, 0},
		{"ReturnIdle", (*shardcache.Cache).ReturnIdle, 0},
		{"Sync/1k-checked", (*shardcache.Cache).Sync, 1000},
	} {
		b.Run(tc.name, func(b *testing.B) {
			be := newAlgoBackend()
			c, keys := warmCache(b, be, 100_000)
			p := algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000_000, Period: time.Second}
			now := be.clk.Now().Add(shardcache.DefaultSyncInterval)
			be.clk.set(now)
			c.Sync(now) // the first sync after the checks settles the rates
			ops := be.syncOps.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				at := now.Add(time.Duration(i%400) * shardcache.DefaultSyncInterval / 2)
				if tc.checked > 0 {
					b.StopTimer()
					for k := range tc.checked {
						c.TakeLocal(keys[(i*tc.checked+k)%len(keys)], p, 1, at, false)
					}
					b.StartTimer()
				}
				tc.run(c, at)
			}
			b.StopTimer()
			if c.Len() != 100_000 {
				b.Fatalf("%d entries, want 100000", c.Len())
			}
			b.ReportMetric(float64(be.syncOps.Load()-ops)/float64(b.N), "ops/tick")
		})
	}
}

// TestSyncVisitsDueEntries: the sync loop, visiting only the entries
// due, still returns, renews, lapses and drops every one of them at its
// time: 2,000 warm leases taken over 10 s, each key checked again now
// and then, all back or lapsed, and every entry dropped, once the keys
// have been idle longer than two warm leases live; and a clock that jumps
// past the wheel's span finds every entry due.
func TestSyncVisitsDueEntries(t *testing.T) {
	b := newAlgoBackend()
	c, keys := warmCache(t, b, 0)
	l := newLoops(b.clk, shardcache.DefaultSyncInterval, c)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000_000, Period: time.Second}
	for i := range 2000 {
		keys = append(keys, fmt.Appendf(nil, "k%d", i))
	}
	take := func(k []byte) {
		t.Helper()
		r, err := c.Take(ctx, k, p, 1, b.clk.Now(), false)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	for i, k := range keys {
		take(k)
		if i%20 == 19 {
			l.advance(shardcache.DefaultSyncInterval)
		}
	}
	require.Equal(t, 2000, c.Len())
	for i := range 30 { // checks of a tenth of the keys over 30 s
		for _, k := range keys[i%10*200 : i%10*200+20] {
			take(k)
		}
		l.advance(time.Second)
	}
	// A lease used since its last op is renewed once more near its
	// lifetime's end, then lapses unused.
	l.advance(2*shardcache.WarmLifeIntervals*shardcache.DefaultSyncInterval + 5*time.Second)
	assert.Zero(t, c.Len(), "every entry dropped once idle past two warm leases' lives")
	for _, k := range keys {
		lease, _, ok := c.Held(k)
		assert.False(t, ok)
		assert.Zero(t, lease)
	}

	for _, k := range keys[:100] {
		take(k)
	}
	l.advance(shardcache.DefaultSyncInterval)
	require.Equal(t, 100, c.Len())
	b.clk.set(b.clk.Now().Add(time.Hour))
	for range 3 {
		b.clk.set(b.clk.Now().Add(shardcache.DefaultSyncInterval))
		c.Sync(b.clk.Now())
	}
	assert.Zero(t, c.Len(), "a jump past the wheel's span finds every entry due")
}

// TestTakeLocalAllocatesNothing: a check answered from a lease
// allocates nothing, once the sync loop's lists have grown: a quiet
// key's, and the first of an interval of a key whose lease runs low
// (which puts its entry in the list of the loop's next tick). Each
// round is 100 intervals of one check per key, longer than a lease of
// the floor stays quiet at that rate, so every round has each key's
// entry put in the list (counted by the loop's visits).
func TestTakeLocalAllocatesNothing(t *testing.T) {
	b := newAlgoBackend()
	c, keys := warmCache(t, b, 64)
	l := newLoops(b.clk, shardcache.DefaultSyncInterval, c)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000_000, Period: time.Second}
	check := func() {
		for _, k := range keys {
			if _, ok := c.TakeLocal(k, p, 1, b.clk.Now(), false); !ok {
				t.Fatal("not answered locally")
			}
		}
	}
	for range 4 {
		check()
		l.advance(shardcache.DefaultSyncInterval)
	}
	// MemStats counts the whole process's allocations, a goroutine left
	// by an earlier test included: a round may see one of those, but
	// not two rounds of three.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var before, after runtime.MemStats
	allocs := make([]uint64, 3)
	visits := make([]int64, 3)
	for i := range allocs {
		v := c.Visits()
		for range 100 {
			runtime.ReadMemStats(&before)
			check()
			runtime.ReadMemStats(&after)
			allocs[i] += after.Mallocs - before.Mallocs
			l.advance(shardcache.DefaultSyncInterval)
		}
		visits[i] = c.Visits() - v
	}
	t.Logf("rounds of 100 intervals × %d checks: allocations %v, visits %v", len(keys), allocs, visits)
	for _, v := range visits {
		assert.GreaterOrEqual(t, v, int64(len(keys)), "each key's entry was put in the loop's list in each round")
	}
	zero := 0
	for _, a := range allocs {
		if a == 0 {
			zero++
		}
	}
	assert.GreaterOrEqual(t, zero, 2, "allocations in two rounds or more: %v", allocs)
}

// TestMissReasons: rld_cache_misses_total counts each check that waits
// on the store by why the key's lease could not answer it: its first
// check, a lease run out, a lease returned when the key went idle.
func TestMissReasons(t *testing.T) {
	b := newAlgoBackend()
	c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second})
	l := newLoops(b.clk, shardcache.DefaultSyncInterval, c)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Second}
	key := []byte("k")
	count := func() map[string]uint64 {
		m := map[string]uint64{}
		for _, r := range []string{"new", "spent", "returned"} {
			m[r] = shardcache.Misses(r)
		}
		return m
	}
	take := func() {
		t.Helper()
		r, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	before := count()
	take()
	assert.Equal(t, before["new"]+1, shardcache.Misses("new"), "the key's first check")
	for {
		lease, _, _ := c.Held(key)
		if lease == 0 {
			break
		}
		take()
	}
	take()
	assert.Equal(t, before["spent"]+1, shardcache.Misses("spent"), "a check after the lease ran out")
	l.advance(shardcache.DefaultSyncInterval) // idle: the lease goes back
	lease, _, ok := c.Held(key)
	require.True(t, ok)
	require.Zero(t, lease)
	take()
	assert.Equal(t, before["returned"]+1, shardcache.Misses("returned"), "a check after the lease went back")
	assert.Equal(t, before["new"]+1, shardcache.Misses("new"))
}

// BenchmarkBytesPerEntry reports the heap held per entry of a cache of
// 200,000 warm keys (warmCache: keys of 33 bytes), the shared store's own
// share left out: what store.max_keys costs a daemon on Redis per key,
// besides the fail-open local state an outage adds (memstore's
// BenchmarkBytesPerKey).
func BenchmarkBytesPerEntry(b *testing.B) {
	const n = 200_000
	var perEntry float64
	for b.Loop() {
		be := newAlgoBackend()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c, _ := warmCache(b, be, n)
		be.mu.Lock()
		be.states = nil // the shared store's share
		be.mu.Unlock()
		runtime.GC()
		runtime.ReadMemStats(&after)
		perEntry = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(c)
	}
	b.ReportMetric(perEntry, "bytes/entry")
}
