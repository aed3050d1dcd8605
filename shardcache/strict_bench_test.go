package shardcache_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// BenchmarkStrictTake: strict checks of 1,000 keys, one goroutine, on
// the in-process store: the cache's own cost around the store call.
func BenchmarkStrictTake(b *testing.B) {
	be := newAlgoBackend()
	c := newCache(be, be.clk, shardcache.Options{Timeout: time.Minute})
	s := c.Strict()
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1 << 40, Period: time.Second}
	keys := make([][]byte, 1000)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("strict-%d", i))
	}
	now := be.clk.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := s.Take(ctx, keys[i%len(keys)], p, 1, now, false); err != nil {
			b.Fatal(err)
		}
	}
}
