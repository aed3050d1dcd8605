package algo_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/rld/rld/algo"
)

// TestChargeProperties drives timelines of takes and charges: after every
// step Remaining, Reset and (for a denial) RetryAfter stay exact, in debt
// too; and a charge of n that leaves no debt takes exactly n units.
func TestChargeProperties(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 20
	}
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			for seed := range seeds {
				rng := rand.New(rand.NewPCG(uint64(seed), 23+uint64(kind)))
				p := randomParams(rng, kind)
				per, capacity := p.PeriodMicros(), p.Capacity()
				now := int64(t0) + rng.Int64N(per)
				var s algo.State
				for step := range 300 {
					switch rng.IntN(4) {
					case 0:
					case 1:
						now += rng.Int64N(2 * per)
					default:
						now += rng.Int64N(per/p.Limit + 1)
					}
					if rng.IntN(3) == 0 {
						n := 1 + rng.Int64N(capacity)
						before := algo.Decide(p, &s, now, 1, true)
						algo.Charge(p, &s, now, n)
						after := algo.Decide(p, &s, now, 1, true)
						// Remaining counts the unit peeked: before it, R+1 fit.
						if fit := before.Remaining + 1; before.Allowed && n <= fit {
							want := fit - n - 1
							if want >= 0 {
								assert.Equal(t, want, after.Remaining, "seed %d step %d: charge %d", seed, step, n)
							} else {
								assert.False(t, after.Allowed, "seed %d step %d: charge %d of %d left", seed, step, n, fit)
							}
						}
						if !after.Allowed {
							checkRetryAfter(t, p, s, now, 1, after.RetryAfter.Microseconds())
						}
						continue
					}
					cost := 1 + rng.Int64N(capacity)
					r := algo.Decide(p, &s, now, cost, false)
					checkRemaining(t, p, s, now, r)
					checkReset(t, p, s, now, r)
					if !r.Allowed && r.RetryAfter != algo.Never {
						checkRetryAfter(t, p, s, now, cost, r.RetryAfter.Microseconds())
					}
				}
				if t.Failed() {
					t.Fatalf("seed %d, params %+v", seed, p)
				}
			}
		})
	}
}

// TestChargeDebt: a charge beyond what is left puts the key in debt; a
// take is refused until the debt is paid back, and the debt is capped at
// one capacity.
func TestChargeDebt(t *testing.T) {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Second} // a token every 100 ms
	var s algo.State
	now := int64(t0)
	algo.Charge(p, &s, now, 10)
	algo.Charge(p, &s, now, 5) // 5 in debt
	r := algo.Decide(p, &s, now, 1, false)
	assert.False(t, r.Allowed)
	assert.Equal(t, int64(0), r.Remaining)
	assert.Equal(t, 600*time.Millisecond, r.RetryAfter, "5 tokens of debt and the one asked for")
	algo.Charge(p, &s, now, 10)
	algo.Charge(p, &s, now, 10)
	r = algo.Decide(p, &s, now, 1, true)
	assert.Equal(t, 1100*time.Millisecond, r.RetryAfter, "the debt is capped at one capacity")
	assert.Equal(t, 2*time.Second, r.Reset)

	w := algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: time.Second}
	s = algo.State{}
	now = int64(t0) + 250_000
	algo.Charge(w, &s, now, 10)
	algo.Charge(w, &s, now, 10)
	algo.Charge(w, &s, now, 10)
	assert.Equal(t, int64(20), s.B, "capped at 2×L")
	r = algo.Decide(w, &s, now, 1, false)
	assert.Equal(t, 750*time.Millisecond, r.RetryAfter, "the next window")
	assert.True(t, algo.Decide(w, &s, now+750_000, 1, false).Allowed, "a fixed window forgets the debt")
}
