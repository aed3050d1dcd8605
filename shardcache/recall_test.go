package shardcache_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
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
// would then over-admit), while the lease is live. With recalls (which
// reach nobody here), keys far from their limit get warm leases.
func TestUnitsOutMatchLeases(t *testing.T) {
	for _, k := range cachedKinds {
		for _, warm := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/warm=%v", k, warm), func(t *testing.T) { unitsOutMatchLeases(t, k, warm) })
		}
	}
}

// unitsOutMatchLeases runs TestUnitsOutMatchLeases for kind k, with warm
// leases or without.
func unitsOutMatchLeases(t *testing.T, k algo.Kind, warm bool) {
	b := newAlgoBackend()
	var caches []*shardcache.Cache
	for _, h := range []string{"a", "b", "c"} {
		o := shardcache.Options{Timeout: time.Minute, Holder: h, Peers: func() int { return 3 }}
		if warm {
			o.RecallWait = time.Millisecond
			o.Recall = func(context.Context, []byte, algo.Kind) error { return nil }
		}
		caches = append(caches, newCache(b, b.clk, o))
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
}

// warmKey is one key checked through daemon a of a recallPair on a
// fresh store: the warm-lease tests' setting.
type warmKey struct {
	b   *algoBackend
	c   *shardcache.Cache
	p   algo.Params
	key []byte
}

func newWarmKey(k algo.Kind, limit int64, period time.Duration, key string) *warmKey {
	b := newAlgoBackend()
	ca, _ := recallPair(b, false)
	return &warmKey{b: b, c: ca, p: algo.Params{Kind: k, Limit: limit, Period: period}, key: []byte(key)}
}

// ops returns the store ops so far: calls and sync ops.
func (w *warmKey) ops() int64 { return w.b.calls.Load() + w.b.syncOps.Load() }

// take checks the key once, at the store's time, and requires it allowed.
func (w *warmKey) take(t *testing.T) {
	t.Helper()
	r, err := w.c.Take(ctx, w.key, w.p, 1, w.b.clk.Now(), false)
	require.NoError(t, err)
	require.True(t, r.Allowed)
}

// lease returns the units the key holds on lease (0 without an entry).
func (w *warmKey) lease() int64 {
	lease, _, _ := w.c.Held(w.key)
	return lease
}

// TestWarmLeaseKept: a key far from its limit is answered locally after
// its first check, its lease is kept while the key is idle (the syncs
// send nothing for it), renewed about once per lifetime while the key
// is used now and then, and lapses with no call once it is not.
func TestWarmLeaseKept(t *testing.T) {
	for _, k := range []algo.Kind{algo.TokenBucket, algo.GCRA} {
		t.Run(k.String(), func(t *testing.T) {
			// A limit whose refill brings a lease back at once (see
			// TestSlowBucketWarmLeaseGoesBack for one that does not).
			w := newWarmKey(k, 1_000_000, time.Second, "warm")
			w.take(t)
			require.EqualValues(t, 1, w.ops(), "the first check is one store op")
			for range 3 {
				w.take(t)
			}
			assert.EqualValues(t, 1, w.ops(), "the next checks are local (the lease is at least 8 units)")
			l := newLoops(w.b.clk, shardcache.DefaultSyncInterval, w.c)
			l.advance(2 * time.Second)
			assert.EqualValues(t, 1, w.ops(), "an idle warm lease is kept, with no op")
			w.take(t)
			assert.EqualValues(t, 1, w.ops(), "and answers the key's next check")
			// One check a second for a minute: renewed when it runs
			// low (it holds about 10 s of the key's traffic, at least
			// warmFloor units), not at every sync.
			for range 60 {
				l.advance(time.Second)
				w.take(t)
			}
			renewals := w.ops() - 1
			t.Logf("%s: %d store ops for a minute of one check a second", k, renewals)
			assert.LessOrEqual(t, renewals, int64(4))
			// Unused from now on: at most one renewal reports the last
			// check's unit, then the lease lapses with no call.
			before := w.ops()
			l.advance(2 * (shardcache.WarmLifeIntervals + 10) * shardcache.DefaultSyncInterval)
			assert.LessOrEqual(t, w.ops()-before, int64(1), "an unused warm lease lapses with no call")
			assert.Zero(t, w.c.Len(), "and its entry is dropped")
		})
	}
}

// TestQuietWarmLeaseSkipsTheLoop: a key checked every interval while it
// holds a warm lease of many intervals of its traffic is not visited by
// the sync loop at every tick after a check (twice an interval), only
// when its lease runs low; the traffic it saw meanwhile is spread over
// the intervals it spans, so the lease it is then renewed to is sized
// by its rate per interval, not by all it used since the loop last saw
// it.
func TestQuietWarmLeaseSkipsTheLoop(t *testing.T) {
	for _, k := range []algo.Kind{algo.TokenBucket, algo.GCRA} {
		t.Run(k.String(), func(t *testing.T) {
			w := newWarmKey(k, 1_000_000_000, time.Hour, "quiet")
			w.take(t)
			require.EqualValues(t, shardcache.WarmFloor, w.lease(), "the first check leases the warm floor")
			l := newLoops(w.b.clk, shardcache.DefaultSyncInterval, w.c)
			// Enough traffic that warmIntervals of it outgrow the floor,
			// for long enough that the floor runs low.
			perInterval := 2*shardcache.WarmFloor/shardcache.WarmIntervals + 1
			intervals := shardcache.WarmFloor/perInterval + 10
			visits := w.c.Visits()
			var leases, rates []int64
			for range intervals {
				for range perInterval {
					w.take(t)
				}
				l.advance(shardcache.DefaultSyncInterval)
				leases = append(leases, w.lease())
				rates = append(rates, w.c.Rate(w.key))
			}
			visits = w.c.Visits() - visits
			t.Logf("%s: %d visits in %d intervals; leases %v; rates %v", k, visits, intervals, leases, rates)
			assert.Less(t, visits, int64(intervals/2), "visited far less than twice an interval")
			assert.Positive(t, visits, "visited as the lease ran low")
			assert.LessOrEqual(t, slices.Max(rates), int64(2*perInterval),
				"the rate is per interval, the traffic of a quiet spell spread over it")
			renewed := slices.Max(leases)
			assert.Greater(t, renewed, int64(shardcache.WarmFloor), "renewed before it ran out")
			assert.LessOrEqual(t, renewed, int64(2*perInterval*shardcache.WarmIntervals),
				"renewed to about warmIntervals of its traffic per interval")
			assert.EqualValues(t, 2, w.ops(), "the first check and one renewal: no check missed the lease")
		})
	}
}

// TestQuietEndsAtTheStore: a quiet key is back in the sync loop's next
// ticks as soon as the store answers one of its takes with something
// the loop must see to: a lease that is not warm (a check larger than
// the warm lease, near the limit) goes back when idle within a few
// intervals, not at the old warm lease's end; and a key denied once per
// interval keeps the denial's own retry-after, its denials counted per
// interval rather than piled up into a hammered key's.
func TestQuietEndsAtTheStore(t *testing.T) {
	t.Run("cold lease", func(t *testing.T) {
		w := newWarmKey(algo.TokenBucket, 1000, time.Hour, "cold")
		w.take(t)
		l := newLoops(w.b.clk, shardcache.DefaultSyncInterval, w.c)
		l.advance(3 * shardcache.DefaultSyncInterval)
		r, err := w.c.Take(ctx, w.key, w.p, 600, w.b.clk.Now(), false)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.Positive(t, w.lease(), "the large check leased more")
		start := w.b.clk.Now()
		for i := 0; i < 300 && w.lease() > 0; i++ {
			l.advance(shardcache.DefaultSyncInterval / 2)
		}
		back := w.b.clk.Now().Sub(start)
		t.Logf("the lease went back %v after the check", back)
		assert.Zero(t, w.lease())
		assert.LessOrEqual(t, back, 5*shardcache.DefaultSyncInterval, "an idle lease that is not warm goes back within a few intervals")
	})
	t.Run("denials", func(t *testing.T) {
		// Recalls reach nobody: a denial waits 1 ms for them, not 10 s.
		b := newAlgoBackend()
		ca, _ := recallPair(b, true)
		w := &warmKey{b: b, c: ca, p: algo.Params{Kind: algo.TokenBucket, Limit: 100, Period: time.Hour}, key: []byte("denied")}
		w.take(t)
		l := newLoops(w.b.clk, shardcache.DefaultSyncInterval, w.c)
		l.advance(3 * shardcache.DefaultSyncInterval)
		denied := 0
		for range 20 {
			r, err := w.c.Take(ctx, w.key, w.p, 80, w.b.clk.Now(), false)
			require.NoError(t, err)
			if !r.Allowed {
				denied++
				assert.LessOrEqual(t, r.RetryAfter, time.Second, "a check denied once an interval is not a hammered key")
			}
			l.advance(shardcache.DefaultSyncInterval)
		}
		assert.Positive(t, denied)
	})
}

// TestWarmWindowLease: a fixed window or sliding counter key far from
// its limit is answered locally after its first check in a window, with
// no return when it goes idle; its lease ends with the window: a fixed
// window's lapses with no call, a sliding counter's goes back once,
// before the window ends. (Before warm leases for windows, each check
// of such a key was a take with a lease and a return.)
func TestWarmWindowLease(t *testing.T) {
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingCounter} {
		t.Run(k.String(), func(t *testing.T) {
			w := newWarmKey(k, 1_000_000, time.Minute, "warm-window")
			// Start a second into a window (windows are aligned on the
			// epoch, as the store's are).
			start := w.b.clk.Now().Truncate(time.Minute).Add(time.Minute + time.Second)
			w.b.clk.set(start)
			l := newLoops(w.b.clk, shardcache.DefaultSyncInterval, w.c)

			w.take(t)
			require.EqualValues(t, 1, w.ops(), "the first check is one store op")
			l.advance(2 * time.Second)
			assert.EqualValues(t, 1, w.ops(), "an idle warm lease is kept, with no op")
			// One check a second for most of the window.
			for range 50 {
				w.take(t)
				l.advance(time.Second)
			}
			inWindow := w.ops()
			t.Logf("%s: %d store ops for 51 checks in one window", k, inWindow)
			assert.LessOrEqual(t, inWindow, int64(4), "renewed when low, not returned when idle")
			require.Positive(t, w.lease(), "the lease is still held near the window's end")

			l.advance(start.Add(time.Minute - time.Second).Sub(w.b.clk.Now())) // the next window's start
			assert.Zero(t, w.lease(), "the lease ended with its window")
			want := int64(0) // a fixed window's units are lost with it
			if k == algo.SlidingCounter {
				want = 1 // a return, while the window is current
			}
			assert.Equal(t, want, w.ops()-inWindow, "ops at the window's end")
			w.b.mu.Lock()
			for _, o := range w.b.state(w.key, w.p).Out {
				assert.LessOrEqual(t, o.Until, w.b.clock(), "the store counts nothing out once the window has ended: %+v", o)
			}
			w.b.mu.Unlock()

			w.take(t)
			assert.Equal(t, want+1, w.ops()-inWindow, "the next window's first check is one store op")
		})
	}
}

// TestSlowBucketWarmLeaseGoesBack: an unused warm lease of a bucket
// that refills slowly (1,000 a day: its lease is hours of refill) goes
// back at its lifetime's end, where a fast bucket's lapses with no call
// (TestWarmLeaseKept): lapsed, its units would be out of the bucket
// until it refilled, and a burst within the capacity refused meanwhile.
func TestSlowBucketWarmLeaseGoesBack(t *testing.T) {
	for _, k := range []algo.Kind{algo.TokenBucket, algo.GCRA} {
		t.Run(k.String(), func(t *testing.T) {
			w := newWarmKey(k, 1_000, 24*time.Hour, "daily")
			// The bucket refills a few units meanwhile, up to its
			// capacity: at least what the three checks left.
			left := outlivedWarmLease(t, w)
			assert.GreaterOrEqual(t, left, w.p.Limit-3, "the unused units are back in the bucket, not out until it refills")
		})
	}
}

// TestWarmWindowLeaseOutlivedGoesBack: a warm lease of a window longer
// than a warm lease's lifetime (an hour) is renewed near its lifetime's
// end when it was used since its last op, like a bucket's; one that was
// not goes back, where a bucket's would lapse with no call: lapsed, its
// units would be lost to the key for the rest of the hour.
func TestWarmWindowLeaseOutlivedGoesBack(t *testing.T) {
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingCounter} {
		t.Run(k.String(), func(t *testing.T) {
			w := newWarmKey(k, 1_000, time.Hour, "hourly")
			w.b.clk.set(w.b.clk.Now().Truncate(time.Hour).Add(time.Hour + time.Minute))
			left := outlivedWarmLease(t, w)
			assert.Equal(t, w.p.Limit-3, left, "the unused units are back in the window")
		})
	}
}

// outlivedWarmLease checks w's key three times, which leases it warm,
// and leaves it idle: the lease is kept, renewed once near its
// lifetime's end (it was used since its last op), then, unused past the
// renewal's lifetime, given back in one op. It returns what the key has
// left at the store then.
func outlivedWarmLease(t *testing.T, w *warmKey) int64 {
	t.Helper()
	l := newLoops(w.b.clk, shardcache.DefaultSyncInterval, w.c)
	for range 3 {
		w.take(t)
	}
	lease := w.lease()
	require.Positive(t, lease, "a warm lease")
	assert.Equal(t, w.p.Limit-3-lease, w.b.remaining(string(w.key), w.p), "the lease is taken in the store")
	l.advance(10 * time.Second)
	assert.EqualValues(t, 1, w.ops(), "kept while idle")
	life := shardcache.WarmLifeIntervals * shardcache.DefaultSyncInterval
	l.advance(life)
	assert.EqualValues(t, 2, w.ops(), "renewed near its lifetime's end: it was used since its last op")
	require.Positive(t, w.lease())
	l.advance(life + 10*time.Second) // past the renewal's lifetime, unused
	assert.Zero(t, w.lease())
	assert.EqualValues(t, 3, w.ops(), "one return")
	return w.b.remaining(string(w.key), w.p)
}

// TestWarmWindowLeaseSizedToWindow: a windowed key's warm lease taken at
// its window's first check holds about the key's traffic until the
// window ends, not warmIntervals of it: the rest would lapse unused with
// the window.
func TestWarmWindowLeaseSizedToWindow(t *testing.T) {
	for _, k := range []algo.Kind{algo.FixedWindow, algo.SlidingCounter} {
		t.Run(k.String(), func(t *testing.T) {
			w := newWarmKey(k, 1_000_000, time.Second, "per-second")
			w.b.clk.set(w.b.clk.Now().Truncate(time.Second).Add(time.Second))
			l := newLoops(w.b.clk, shardcache.DefaultSyncInterval, w.c)
			// Fewer checks per sync interval than make the sync top a
			// lease up (a hot key's), so that each lease is the check's.
			const perInterval = 3
			var firstLeases []int64
			for window := range 5 {
				for i := range 10 * perInterval {
					w.take(t)
					if i == 0 && window > 0 {
						firstLeases = append(firstLeases, w.lease())
					}
					l.advance(shardcache.DefaultSyncInterval / perInterval)
				}
			}
			t.Logf("%s: leases after each window's first check: %v", k, firstLeases)
			for _, lease := range firstLeases {
				// The window's traffic is 10 intervals × 3; a lease of
				// warmIntervals of it would be about 300.
				assert.LessOrEqual(t, lease, int64(2*10*perInterval))
			}
		})
	}
}

// TestFirstLeaseNearLimitIsNotWarm: a daemon's first check of a key that
// others have nearly used up sizes its lease before the store's answer
// (the key counts as fresh) and may get what is left; the answer shows
// the key near its limit, so the daemon keeps it as an ordinary lease:
// idle, it goes back within a few sync intervals, not after a warm
// lease's 30 s, and a crash of the daemon could not park it for long.
func TestFirstLeaseNearLimitIsNotWarm(t *testing.T) {
	b := newAlgoBackend()
	ca, _ := recallPair(b, false)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: 24 * time.Hour}
	key := []byte("near")
	r, err := b.Take(ctx, key, p, 990, b.clk.Now(), false)
	require.NoError(t, err)
	require.True(t, r.Allowed, "other daemons used 990")
	r, err = ca.Take(ctx, key, p, 1, b.clk.Now(), false)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	lease, _, _ := ca.Held(key)
	require.Positive(t, lease, "the first check leased what was left")
	l := newLoops(b.clk, shardcache.DefaultSyncInterval, ca)
	l.advance(time.Second)
	lease, _, _ = ca.Held(key)
	assert.Zero(t, lease, "an ordinary lease: back when the key went idle")
	assert.EqualValues(t, 9, b.remaining(string(key), p), "the units are back in the store")
}
