package shardcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// hungBackend's calls for the key "hung" block until their context ends,
// as a call on a connection to a frozen Redis does; other keys go to the
// algoBackend.
type hungBackend struct {
	*algoBackend
	hung atomic.Bool
}

func (h *hungBackend) block(ctx context.Context, key []byte) error {
	if string(key) != "hung" || !h.hung.Load() {
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		panic("a store call without a deadline")
	}
	<-ctx.Done()
	return ctx.Err()
}

func (h *hungBackend) TakeLease(ctx context.Context, key []byte, p algo.Params, costs []int64, want int64) (int, int64, algo.Result, error) {
	if err := h.block(ctx, key); err != nil {
		return 0, 0, algo.Result{}, err
	}
	return h.algoBackend.TakeLease(ctx, key, p, costs, want)
}

// TestHungStoreHoldsNothing: while the store hangs on one key, every
// check of that key, cached or strict, fails within about the timeout
// (the coalescing flight's run has the timeout as its deadline), checks
// of other keys in the same shard are not held up, and the key is
// decided again once the store answers.
func TestHungStoreHoldsNothing(t *testing.T) {
	const timeout = 200 * time.Millisecond
	b := &hungBackend{algoBackend: newAlgoBackend()}
	c := newCache(b, b.clk, shardcache.Options{Timeout: timeout, Shards: 1})
	stores := map[string]interface {
		Take(context.Context, []byte, algo.Params, int64, time.Time, bool) (algo.Result, error)
	}{"cached": c, "strict": c.Strict()}
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000, Period: time.Hour}
	b.hung.Store(true)
	for name, s := range stores {
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			var slowest atomic.Int64
			var failed atomic.Int64
			for range 16 {
				wg.Go(func() {
					for range 2 {
						start := time.Now()
						_, err := s.Take(ctx, []byte("hung"), p, 1, b.clk.Now(), false)
						if err != nil {
							failed.Add(1)
						}
						for d := int64(time.Since(start)); d > slowest.Load(); {
							if slowest.CompareAndSwap(slowest.Load(), d) {
								break
							}
						}
					}
				})
			}
			// Another key of the same shard is decided meanwhile.
			for range 20 {
				start := time.Now()
				r, err := s.Take(ctx, []byte("fine"), p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				assert.True(t, r.Allowed)
				assert.Less(t, time.Since(start), timeout/2, "not held up by the hung key")
			}
			wg.Wait()
			t.Logf("%s: 32 checks of a hung key: %d failed, the slowest in %v (timeout %v)", name, failed.Load(), time.Duration(slowest.Load()).Round(time.Millisecond), timeout)
			assert.Equal(t, int64(32), failed.Load())
			// A queued check waits for the flight before it, then runs
			// its own: two timeouts at most, with slack for -race.
			assert.Less(t, time.Duration(slowest.Load()), 2*timeout+100*time.Millisecond)
		})
	}
	// Runs whose callers left at their deadline may still be in flight,
	// until their own deadline: the key is decided again after them.
	b.hung.Store(false)
	for name, s := range stores {
		assert.Eventually(t, func() bool {
			r, err := s.Take(ctx, []byte("hung"), p, 1, b.clk.Now(), false)
			return err == nil && r.Allowed
		}, 2*time.Second, 10*time.Millisecond, name)
	}
}
