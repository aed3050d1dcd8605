package shardcache_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
// loop pays twice per sync interval.
func BenchmarkSync100k(b *testing.B) {
	for _, tc := range []struct {
		name string
		run  func(*shardcache.Cache, time.Time) int
	}{
		{"Sync", (*shardcache.Cache).Sync},
		{"ReturnIdle", (*shardcache.Cache).ReturnIdle},
	} {
		b.Run(tc.name, func(b *testing.B) {
			be := newAlgoBackend()
			c, _ := warmCache(b, be, 100_000)
			now := be.clk.Now().Add(shardcache.DefaultSyncInterval)
			be.clk.set(now)
			c.Sync(now) // the first sync after the checks settles the rates
			ops := be.syncOps.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				tc.run(c, now)
			}
			b.StopTimer()
			if c.Len() != 100_000 {
				b.Fatalf("%d entries, want 100000", c.Len())
			}
			b.ReportMetric(float64(be.syncOps.Load()-ops)/float64(b.N), "ops/tick")
		})
	}
}
