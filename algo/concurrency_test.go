package algo_test

import (
	"math/rand/v2"
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
			got := algo.Release(p, &s, now, h.at, h.cost)
			assert.Equal(t, live, got, "seed %d step %d: release of %+v at %d", seed, step, h, now)
			held = append(held[:i], held[i+1:]...)
			// A second release of the same admission finds nothing, unless
			// another admission shares its microsecond.
			shared := false
			for _, o := range held {
				shared = shared || o.at == h.at
			}
			if !shared {
				assert.False(t, algo.Release(p, &s, now, h.at, h.cost), "seed %d step %d: released twice", seed, step)
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
