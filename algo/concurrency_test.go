package algo_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
)

// TestConcurrencyProperties drives random acquires and releases and checks
// them against a model of the slots in flight: an acquire is allowed
// exactly when its slots fit beside the unexpired, unreleased ones; a
// release succeeds exactly for an admission still held; Remaining is the
// free slots; a denial's RetryAfter is the time until enough slots expire.
func TestConcurrencyProperties(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 30
	}
	type slot struct{ at, cost int64 }
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 17))
		p := algo.Params{Kind: algo.Concurrency, Limit: 1 + rng.Int64N(10), Period: time.Duration(1000+rng.Int64N(2_000_000)) * time.Microsecond}
		require.NoError(t, p.Validate())
		per := p.PeriodMicros()
		now := int64(t0)
		var s algo.State
		var held []slot // admissions, possibly expired or sharing an at
		live := func() (n int64) {
			for _, h := range held {
				if h.at > now-per {
					n += h.cost
				}
			}
			return n
		}
		for step := range 400 {
			switch rng.IntN(4) {
			case 0: // same µs
			case 1:
				now += rng.Int64N(2 * per)
			default:
				now += rng.Int64N(per/4 + 1)
			}
			if rng.IntN(2) == 0 || len(held) == 0 {
				cost := 1 + rng.Int64N(2)
				in := live()
				r := algo.Decide(p, &s, now, cost, false)
				require.Equal(t, in+cost <= p.Limit, r.Allowed, "seed %d step %d: %d in flight, cost %d, limit %d", seed, step, in, cost, p.Limit)
				if r.Allowed {
					held = append(held, slot{r.At, cost})
					assert.Equal(t, p.Limit-in-cost, r.Remaining, "seed %d step %d", seed, step)
				} else if cost > p.Limit {
					assert.Equal(t, algo.Never, r.RetryAfter, "seed %d step %d", seed, step)
				} else {
					assert.Equal(t, p.Limit-in, r.Remaining, "seed %d step %d", seed, step)
					wait := r.RetryAfter.Microseconds()
					assert.True(t, algo.Decide(p, &s, now+wait, cost, true).Allowed, "seed %d step %d: denied at RetryAfter", seed, step)
					assert.False(t, algo.Decide(p, &s, now+wait-1, cost, true).Allowed, "seed %d step %d: allowed before RetryAfter", seed, step)
				}
				continue
			}
			i := rng.IntN(len(held))
			h := held[i]
			live := h.at > now-per
			got := algo.Release(p, &s, now, h.at, 0, h.cost)
			assert.Equal(t, live, got, "seed %d step %d: release of %+v at %d", seed, step, h, now)
			held = append(held[:i], held[i+1:]...)
			// A second release of the same admission finds nothing, unless
			// another admission shares its microsecond.
			shared := false
			for _, o := range held {
				shared = shared || o.at == h.at
			}
			if !shared {
				assert.False(t, algo.Release(p, &s, now, h.at, 0, h.cost), "seed %d step %d: released twice", seed, step)
			}
		}
		if t.Failed() {
			t.Fatalf("seed %d, params %+v", seed, p)
		}
	}
}

// TestReleaseOp: OpRelease reports whether it released, and leaves an
// unknown or expired lease id alone.
func TestReleaseOp(t *testing.T) {
	p := algo.Params{Kind: algo.Concurrency, Limit: 2, Period: time.Second}
	const now = t0
	var s algo.State
	a := algo.Decide(p, &s, now, 1, false)
	b := algo.Decide(p, &s, now+10, 1, false)
	require.True(t, a.Allowed && b.Allowed)
	require.False(t, algo.Decide(p, &s, now+20, 1, true).Allowed)

	before := clone(s)
	op := algo.Op{Kind: algo.OpRelease, Params: p, N: 1, TakenAt: now + 5}
	algo.Apply(&op, &s, now+20)
	assert.Equal(t, 0, op.Admitted)
	assert.Equal(t, before, s)

	op = algo.Op{Kind: algo.OpRelease, Params: p, N: 1, TakenAt: a.At}
	algo.Apply(&op, &s, now+20)
	assert.Equal(t, 1, op.Admitted)
	assert.Equal(t, int64(1), op.Result.Remaining, "the slots free after the release: the one freed")
	assert.True(t, algo.Decide(p, &s, now+20, 1, true).Allowed)

	// b expires at b.At+P: releasing it then finds nothing.
	op = algo.Op{Kind: algo.OpRelease, Params: p, N: 1, TakenAt: b.At}
	algo.Apply(&op, &s, b.At+p.PeriodMicros())
	assert.Equal(t, 0, op.Admitted)
	assert.Equal(t, "release", algo.OpRelease.String())
}

// TestAcquireSlots drives random batches of acquires (many at one
// microsecond, some with the clock stepped back) and releases, each
// released up to twice, against a model of the slots in flight: a
// release frees exactly its own slot, once; a second release, or one
// after the slot expired, changes nothing; the slots held never exceed
// the limit.
func TestAcquireSlots(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 20
	}
	type slot struct {
		at int64
		id uint64
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 29))
		p := algo.Params{Kind: algo.Concurrency, Limit: 1 + rng.Int64N(6), Period: time.Duration(1000+rng.Int64N(1_000_000)) * time.Microsecond}
		per := p.PeriodMicros()
		now := int64(t0)
		var s algo.State
		var held, gone []slot // held: acquired, maybe expired; gone: released
		var next uint64
		live := func() (n int64) {
			for _, h := range held {
				if h.at > now-per {
					n++
				}
			}
			return n
		}
		for step := range 300 {
			switch rng.IntN(5) {
			case 0, 1: // the same µs
			case 2:
				now += rng.Int64N(2 * per)
			case 3:
				now = max(now-rng.Int64N(per/4+1), 1) // the clock steps back
			default:
				now += rng.Int64N(per/4 + 1)
			}
			if rng.IntN(2) == 0 || len(held) == 0 {
				ids := make([]uint64, 1+rng.IntN(4))
				for i := range ids {
					next += 1 + uint64(rng.IntN(3))
					ids[i] = next
					if rng.IntN(3) == 0 {
						ids[i] = 1<<63 - next // ids out of order
					}
				}
				in := live()
				op := algo.Op{Kind: algo.OpAcquire, Params: p, Slots: ids}
				algo.Apply(&op, &s, now)
				want := int(min(int64(len(ids)), max(p.Limit-in, 0)))
				require.Equal(t, want, op.Admitted, "seed %d step %d: %d in flight, now %d, log %+v, held %+v, res %+v", seed, step, in, now, s.Log, held, op.Result)
				if op.Admitted > 0 {
					// An admission drops the expired entries.
					held = slices.DeleteFunc(held, func(h slot) bool { return h.at <= now-per })
				}
				for _, id := range ids[:op.Admitted] {
					held = append(held, slot{op.Result.At, id})
				}
				require.GreaterOrEqual(t, op.Result.At, now, "seed %d step %d", seed, step)
				var n int64
				for _, en := range s.Log {
					if en.At > now-per {
						n += en.Cost
					}
				}
				require.LessOrEqual(t, n, p.Limit, "seed %d step %d: over the limit", seed, step)
				continue
			}
			if len(gone) > 0 && rng.IntN(3) == 0 {
				// A second release of a released slot changes nothing.
				g := gone[rng.IntN(len(gone))]
				before := clone(s)
				require.False(t, algo.Release(p, &s, now, g.at, g.id, 1), "seed %d step %d: released twice", seed, step)
				require.Equal(t, before, s)
				continue
			}
			i := rng.IntN(len(held))
			h := held[i]
			in := live()
			got := algo.Release(p, &s, now, h.at, h.id, 1)
			require.Equal(t, h.at > now-per, got, "seed %d step %d: release of %+v at %d", seed, step, h, now)
			if got {
				// An expired slot stays in the model: a clock that
				// steps back finds it live again, as the log does.
				held = append(held[:i], held[i+1:]...)
				gone = append(gone, h)
			}
			assert.Equal(t, live(), in-b2i(got), "seed %d step %d: a release freed another slot", seed, step)
			var n int64
			for _, en := range s.Log {
				if en.At > now-per {
					n += en.Cost
				}
			}
			require.Equal(t, live(), n, "seed %d step %d: the log holds other slots than the model", seed, step)
		}
	}
}

// TestAcquireOneMicrosecond: two slots acquired in one call share a time;
// releasing the first twice frees it once and leaves the second held.
func TestAcquireOneMicrosecond(t *testing.T) {
	p := algo.Params{Kind: algo.Concurrency, Limit: 3, Period: time.Second}
	var s algo.State
	op := algo.Op{Kind: algo.OpAcquire, Params: p, Slots: []uint64{7, 3}}
	algo.Apply(&op, &s, t0)
	require.Equal(t, 2, op.Admitted)
	at := op.Result.At
	assert.Equal(t, []algo.Entry{{At: at, Cost: 1, Slot: 3}, {At: at, Cost: 1, Slot: 7}}, s.Log)
	rel := algo.Op{Kind: algo.OpRelease, Params: p, N: 1, TakenAt: at, Slot: 7}
	algo.Apply(&rel, &s, t0+10)
	assert.Equal(t, 1, rel.Admitted)
	rel = algo.Op{Kind: algo.OpRelease, Params: p, N: 1, TakenAt: at, Slot: 7}
	algo.Apply(&rel, &s, t0+20)
	assert.Equal(t, 0, rel.Admitted, "released twice")
	assert.Equal(t, []algo.Entry{{At: at, Cost: 1, Slot: 3}}, s.Log)
	assert.Equal(t, int64(2), rel.Result.Remaining)
	// Two more fit, the third does not: the second slot is still held.
	op = algo.Op{Kind: algo.OpAcquire, Params: p, Slots: []uint64{8, 9, 10}}
	algo.Apply(&op, &s, t0+30)
	assert.Equal(t, 2, op.Admitted)
	assert.False(t, op.Result.Allowed)
	// A release by time alone (no slot) frees none of the slots.
	rel = algo.Op{Kind: algo.OpRelease, Params: p, N: 1, TakenAt: at}
	algo.Apply(&rel, &s, t0+40)
	assert.Equal(t, 0, rel.Admitted)
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
