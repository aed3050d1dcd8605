package shardcache_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// refundPair returns two caches, daemons "a" and "b" of one fleet on b,
// whose recalls reach each other at once, and their refunds'
// announcements too, or never when lost is set.
func refundPair(b shardcache.Backend, clk *fakeClock, lost bool) (ca, cb *shardcache.Cache) {
	o := func(holder string, other **shardcache.Cache) shardcache.Options {
		return shardcache.Options{
			Timeout: time.Minute, RecallWait: 10 * time.Second, Holder: holder, Peers: func() int { return 2 },
			Recall: func(_ context.Context, key []byte, kind algo.Kind) error {
				(*other).Recalled(key, kind, clk.Now())
				return nil
			},
			Refunded: func(_ context.Context, key []byte, kind algo.Kind) error {
				if !lost {
					(*other).Corrected(key, kind)
				}
				return nil
			},
		}
	}
	ca = newCache(b, clk, o("a", &cb))
	cb = newCache(b, clk, o("b", &ca))
	return ca, cb
}

// TestRefundUsableOnEveryCache: a takes a key's whole limit; a and b,
// hammering it, deny it locally; a settle's refund of 99 through a is
// then usable at once on a (its own denial dropped) and on b (the
// refund announced), for every algorithm that leases. With the
// announcement lost, b goes on denying the key with the retry-after of
// its denial from before the refund.
func TestRefundUsableOnEveryCache(t *testing.T) {
	for _, k := range cachedKinds {
		for _, lost := range []bool{false, true} {
			name := k.String()
			if lost {
				name += "/lost"
			}
			t.Run(name, func(t *testing.T) {
				b := newAlgoBackend()
				ca, cb := refundPair(b, b.clk, lost)
				p := algo.Params{Kind: k, Limit: 100, Period: time.Hour}
				key := []byte("refund")
				r, err := ca.Take(ctx, key, p, 100, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed, "%+v", r)
				taken := r.At
				// Both hammer the key: denied at the store, then locally
				// for the store's retry-after.
				for range 20 {
					for _, c := range []*shardcache.Cache{ca, cb} {
						r, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
						require.NoError(t, err)
						require.False(t, r.Allowed)
					}
				}
				r, err = cb.Take(ctx, key, p, 99, b.clk.Now(), false)
				require.NoError(t, err)
				require.False(t, r.Allowed)
				before := r.RetryAfter

				ops := []algo.Op{{Kind: algo.OpRefund, Key: key, Params: p, N: 99, TakenAt: taken}}
				require.NoError(t, ca.Do(ctx, ops, b.clk.Now()))
				require.NoError(t, ops[0].Err)
				require.Equal(t, int64(99), b.remaining(string(key), p))

				r, err = ca.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				assert.True(t, r.Allowed, "a's own denial is dropped by its refund: %+v", r)
				r, err = cb.Take(ctx, key, p, 98, b.clk.Now(), false)
				require.NoError(t, err)
				if lost {
					assert.False(t, r.Allowed, "b's denial from before the refund stands")
					assert.Positive(t, r.RetryAfter)
					t.Logf("%s: announcement lost: b denies 98 with retry-after %v (%v before the refund)", k, r.RetryAfter, before)
					return
				}
				assert.True(t, r.Allowed, "b admits the refunded units: %+v", r)
				assert.Zero(t, b.remaining(string(key), p))
			})
		}
	}
}

// hookBackend runs hook once, after the next Sync or Take call it gets
// has been decided and before its answer is returned: a change of the
// store that lands while the answer is on its way.
type hookBackend struct {
	*algoBackend
	hook atomic.Pointer[func()]
}

func (h *hookBackend) after() {
	if f := h.hook.Swap(nil); f != nil {
		(*f)()
	}
}

func (h *hookBackend) Sync(ctx context.Context, ops []algo.Op) error {
	err := h.algoBackend.Sync(ctx, ops)
	h.after()
	return err
}

func (h *hookBackend) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	r, err := h.algoBackend.Take(ctx, key, p, cost, now, peek)
	h.after()
	return r, err
}

// TestStaleDenialNotKept: a denial that the store gave before a refund,
// and that reaches the cache after the refund's announcement, is the
// answer of the check (or peek) that asked, but is not kept: the key's
// next check asks the store and is admitted.
func TestStaleDenialNotKept(t *testing.T) {
	for _, peek := range []bool{false, true} {
		name := "take"
		if peek {
			name = "peek"
		}
		t.Run(name, func(t *testing.T) {
			hb := &hookBackend{algoBackend: newAlgoBackend()}
			ca, cb := refundPair(hb, hb.clk, false)
			p := algo.Params{Kind: algo.TokenBucket, Limit: 100, Period: time.Hour}
			key := []byte("stale")
			r, err := ca.Take(ctx, key, p, 100, hb.clk.Now(), false)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			taken := r.At
			refund := func() {
				ops := []algo.Op{{Kind: algo.OpRefund, Key: key, Params: p, N: 99, TakenAt: taken}}
				require.NoError(t, ca.Do(ctx, ops, hb.clk.Now()))
				require.NoError(t, ops[0].Err)
			}
			hb.hook.Store(&refund)
			r, err = cb.Take(ctx, key, p, 1, hb.clk.Now(), peek)
			require.NoError(t, err)
			require.False(t, r.Allowed, "decided before the refund")
			require.Nil(t, hb.hook.Load(), "the refund ran while the answer was on its way")
			r, err = cb.Take(ctx, key, p, 99, hb.clk.Now(), false)
			require.NoError(t, err)
			assert.True(t, r.Allowed, "the denial from before the refund was not kept: %+v", r)
		})
	}
}

// TestStrictKnown: a strict rule's checks keep the store's last answer
// for the key, which Known tells (what a Fallback starts from), and the
// key's entry is dropped once idle, as a cached key's is.
func TestStrictKnown(t *testing.T) {
	for _, k := range append(cachedKinds, algo.SlidingLog) {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			c := newCache(b, b.clk, shardcache.Options{Timeout: time.Minute})
			s := c.Strict()
			p := algo.Params{Kind: k, Limit: 10, Period: time.Hour}
			key := []byte("strict")
			_, ok := c.Known(key, p, b.clk.Now())
			assert.False(t, ok, "nothing known before a check")
			for i := range 7 {
				r, err := s.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed, "check %d", i)
			}
			rem, ok := c.Known(key, p, b.clk.Now())
			require.True(t, ok)
			assert.Equal(t, int64(3), rem, "the store's last answer")
			for range 5 {
				_, err := s.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
			}
			rem, ok = c.Known(key, p, b.clk.Now())
			require.True(t, ok)
			assert.Zero(t, rem, "used up")
			assert.Equal(t, 1, c.Len())
			newLoops(b.clk, shardcache.DefaultSyncInterval, c).advance(5 * shardcache.DefaultSyncInterval)
			assert.Zero(t, c.Len(), "the idle key's entry is dropped")
		})
	}
}
