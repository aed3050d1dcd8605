package shardcache_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// recallPair returns two caches, daemons "a" and "b" of one fleet on b,
// whose recalls reach each other at once, or never when lost is set.
func recallPair(b *algoBackend, lost bool) (ca, cb *shardcache.Cache) {
	wait := 10 * time.Second // ample: recalled units come back at once
	if lost {
		wait = time.Millisecond
	}
	o := func(holder string, other **shardcache.Cache) shardcache.Options {
		return shardcache.Options{
			Timeout: time.Minute, RecallWait: wait, Holder: holder, Peers: func() int { return 2 },
			Recall: func(_ context.Context, key []byte, kind algo.Kind) error {
				if !lost {
					(*other).Recalled(key, kind, b.clk.Now())
				}
				return nil
			},
		}
	}
	ca = newCache(b, b.clk, o("a", &cb))
	cb = newCache(b, b.clk, o("b", &ca))
	return ca, cb
}

// TestRecallParkedUnits: daemon a holds units of a key in its lease;
// daemon b, refused by the store, recalls them and is admitted, for
// every algorithm that leases: the two admit exactly the limit, and b is
// refused only once nothing is parked any more.
func TestRecallParkedUnits(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			ca, cb := recallPair(b, false)
			p := algo.Params{Kind: k, Limit: 40, Period: time.Hour}
			key := []byte("parked")
			var admitted int64
			// a's key turns hot: its leases grow with its traffic.
			for range 12 {
				r, err := ca.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				admitted++
			}
			parked := p.Limit - admitted - b.remaining(string(key), p)
			require.Positive(t, parked, "a holds no lease")
			for {
				r, err := cb.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				if !r.Allowed {
					break
				}
				admitted++
			}
			t.Logf("%s: a held %d units; a and b admitted %d", k, parked, admitted)
			assert.Equal(t, p.Limit, admitted, "the two admitted the whole limit")
			assert.Zero(t, b.remaining(string(key), p))
		})
	}
}

// TestResetLeavesLeasesOut: a reset through daemon b while a holds a
// lease, the reset's announcements lost, leaves a fresh key less a's
// units; a then admits from its lease, and the two together admit
// exactly the limit after the reset, no more.
func TestResetLeavesLeasesOut(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			ca, cb := recallPair(b, true)
			p := algo.Params{Kind: k, Limit: 40, Period: time.Hour}
			key := []byte("reset")
			for range 12 {
				_, err := ca.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
			}
			held := p.Limit - 12 - b.remaining(string(key), p)
			require.Positive(t, held, "a holds no lease")
			// Units a admitted from its lease and has not reported yet
			// (a warm lease reports only when renewed) are left out of
			// the fresh key too, which then admits that much less.
			var out int64
			for _, o := range b.state(key, p).Out {
				out += o.Units
			}
			unreported := out - held
			require.GreaterOrEqual(t, unreported, int64(0))
			ops := []algo.Op{{Kind: algo.OpReset, Key: key, Params: p}}
			require.NoError(t, cb.Do(ctx, ops, b.clk.Now()))
			require.NoError(t, ops[0].Err)
			var admitted int64
			for _, c := range []*shardcache.Cache{ca, cb, ca} {
				for {
					r, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
					require.NoError(t, err)
					if !r.Allowed {
						break
					}
					admitted++
				}
			}
			t.Logf("%s: a held %d units at the reset, %d admitted unreported; %d admitted after it", k, held, unreported, admitted)
			assert.Equal(t, p.Limit-unreported, admitted, "admitted after the reset")
		})
	}
}

// TestUnitsOutMatchLeases: three daemons' caches on one store, random
// checks, local refunds and sync ticks over a few keys and a fake clock:
// after every step, the units the store counts out for each daemon and
// key are what the daemon holds on lease plus what it admitted from its
// lease without reporting it yet, never fewer than it holds (a reset
// would then over-admit), while the lease is live.
func TestUnitsOutMatchLeases(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			var caches []*shardcache.Cache
			for _, h := range []string{"a", "b", "c"} {
				caches = append(caches, newCache(b, b.clk, shardcache.Options{Timeout: time.Minute, Holder: h, Peers: func() int { return 3 }}))
			}
			l := newLoops(b.clk, shardcache.DefaultSyncInterval, caches...)
			p := algo.Params{Kind: k, Limit: 2_000, Period: time.Minute}
			keys := [][]byte{[]byte("k0"), []byte("k1"), []byte("k2")}
			rng := rand.New(rand.NewPCG(uint64(k), 7))
			var taken []time.Time // admissions of cache 0 on k0, for refunds
			for step := range 3_000 {
				c, key := caches[rng.IntN(3)], keys[rng.IntN(3)]
				switch rng.IntN(10) {
				case 0:
					l.advance(time.Duration(rng.IntN(60)) * time.Millisecond)
				case 1:
					if len(taken) > 0 {
						at := taken[len(taken)-1]
						taken = taken[:len(taken)-1]
						require.NoError(t, caches[0].Refund(ctx, keys[0], p, 1, at, b.clk.Now()))
					}
				default:
					r, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
					require.NoError(t, err)
					if r.Allowed && c == caches[0] && string(key) == "k0" {
						taken = append(taken, time.UnixMicro(r.At))
					}
				}
				b.mu.Lock()
				now := b.clock()
				for ci, c := range caches {
					holder := string(rune('a' + ci))
					for _, key := range keys {
						lease, spent, ok := c.Held(key)
						var out algo.Out
						for _, o := range b.state(key, p).Out {
							if o.Holder == holder && o.Until > now {
								out = o
							}
						}
						if ok && out.Until > 0 && out.Units != lease+spent || lease > 0 && out.Units < lease {
							b.mu.Unlock()
							t.Fatalf("step %d: %s holds %d on lease of %s, %d spent unreported (entry %v); the store counts %+v", step, holder, lease, key, spent, ok, out)
						}
					}
				}
				b.mu.Unlock()
			}
		})
	}
}
