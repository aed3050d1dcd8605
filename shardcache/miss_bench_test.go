package shardcache_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// BenchmarkTakeMiss: a check of a key the cache does not hold, which
// asks the store (the in-memory algoBackend) with a lease: the miss path
// without the network.
func BenchmarkTakeMiss(b *testing.B) {
	be := newAlgoBackend()
	c := newCache(be, be.clk, shardcache.Options{Timeout: time.Second, Holder: "a", MaxEntries: 1 << 20})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
	keys := make([][]byte, b.N)
	for i := range keys {
		keys[i] = []byte("k" + strconv.Itoa(i))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := c.Take(ctx, keys[i], p, 1, be.clk.Now(), false); err != nil {
			b.Fatal(err)
		}
	}
}
