package algo_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rld/rld/algo"
)

// TestNext drives every algorithm through random timelines: a denied
// answer's Next is positive and never later than its RetryAfter, and a
// unit is available once Next has passed; an allowed answer's Next, when
// known, is a time within which Remaining does not grow.
func TestNext(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			for seed := range 200 {
				rng := rand.New(rand.NewPCG(uint64(seed), 7))
				p := randomParams(rng, kind)
				var s algo.State
				now := int64(1_700_000_000_000_000)
				for range 200 {
					now += rng.Int64N(p.PeriodMicros() / 4)
					cost := 1 + rng.Int64N(2)
					r := algo.Decide(p, &s, now, cost, false)
					next := algo.Next(p, &r)
					us := next.Microseconds()
					switch {
					case r.RetryAfter == algo.Never:
						if next >= 0 {
							t.Fatalf("seed %d: Next %v for a cost that never fits", seed, next)
						}
					case !r.Allowed:
						if next <= 0 || next > r.RetryAfter {
							t.Fatalf("seed %d %+v: denied, Next %v, RetryAfter %v", seed, p, next, r.RetryAfter)
						}
						if after := algo.Decide(p, &s, now+us, 1, true); !after.Allowed {
							t.Fatalf("seed %d %+v: no unit %v after a denial: %+v", seed, p, next, after)
						}
					case next > 3*time.Microsecond:
						// A peek answers as the check would: Remaining is
						// what is left after its unit. Next is rounded up,
						// by at most 2 µs.
						if before := algo.Decide(p, &s, now+us-3, 1, true); before.Allowed && before.Remaining+1 > r.Remaining {
							t.Fatalf("seed %d %+v: %d available within Next %v of an answer with %d remaining", seed, p, before.Remaining+1, next, r.Remaining)
						}
					}
				}
			}
		})
	}
}

// TestSustained: a client spacing its requests evenly at q per w is never
// refused, for every algorithm, whatever the phase.
func TestSustained(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			for seed := range 100 {
				rng := rand.New(rand.NewPCG(uint64(seed), 11))
				p := algo.Params{Kind: kind, Limit: 1 + rng.Int64N(20), Period: time.Duration(1+rng.Int64N(60)) * time.Second}
				q, w := algo.Sustained(p)
				step := w.Microseconds() / q
				if w.Microseconds()%q != 0 {
					step++ // the pacer rounds its spacing up, as a client would
				}
				var s algo.State
				now := int64(1_700_000_000_000_000) + rng.Int64N(p.PeriodMicros())
				for i := range 5*q + 3 {
					if r := algo.Decide(p, &s, now, 1, false); !r.Allowed {
						t.Fatalf("%+v: q=%d per %v refused at request %d: %+v", p, q, w, i, r)
					}
					now += step
				}
			}
		})
	}
}
