package algo_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rld/rld/algo"
)

// admission is one admitted take of a property timeline.
type admission struct{ at, cost int64 }

// TestProperties drives every algorithm through random timelines and
// checks, at every step, that peeks and denials leave the state alone,
// that Remaining, Reset and RetryAfter are exact, and that refunds restore
// an equivalent state; at the end, that the admissions never exceed the
// algorithm's bound over any span of time.
func TestProperties(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 30
	}
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			for seed := range seeds {
				rng := rand.New(rand.NewPCG(uint64(seed), uint64(kind)))
				p := randomParams(rng, kind)
				if err := p.Validate(); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				log := runTimeline(t, rng, p)
				checkBound(t, p, log)
				if t.Failed() {
					t.Fatalf("seed %d, params %+v", seed, p)
				}
			}
		})
	}
}

func randomParams(rng *rand.Rand, kind algo.Kind) algo.Params {
	p := algo.Params{
		Kind:   kind,
		Limit:  1 + rng.Int64N(20),
		Period: time.Duration(1000+rng.Int64N(3_000_000)) * time.Microsecond,
	}
	if rng.IntN(2) == 0 {
		p.Burst = 1 + rng.Int64N(30)
	}
	return p
}

// runTimeline runs one random timeline and returns what it admitted.
func runTimeline(t *testing.T, rng *rand.Rand, p algo.Params) []admission {
	t.Helper()
	per, capacity := p.PeriodMicros(), p.Capacity()
	now := int64(t0) + rng.Int64N(per)
	var (
		s   algo.State
		log []admission
	)
	for range 400 {
		switch rng.IntN(10) {
		case 0, 1, 2:
			// same microsecond
		case 3:
			now += rng.Int64N(3 * per)
		default:
			now += rng.Int64N(2*per/p.Limit + 1)
		}
		cost := int64(1)
		switch rng.IntN(20) {
		case 0:
			cost = capacity + 1 + rng.Int64N(3)
		case 1, 2, 3, 4, 5, 6:
			cost = 1 + rng.Int64N(capacity)
		}
		isPeek := rng.IntN(10) == 0

		before := clone(s)
		r := algo.Decide(p, &s, now, cost, isPeek)
		switch {
		case r.Limit != capacity:
			t.Errorf("at %d: Limit %d, want %d", now, r.Limit, capacity)
		case cost > capacity && (r.Allowed || r.RetryAfter != algo.Never):
			t.Errorf("at %d: cost %d above capacity %d: %+v", now, cost, capacity, r)
		case r.Allowed && r.RetryAfter != 0:
			t.Errorf("at %d: allowed with RetryAfter %v", now, r.RetryAfter)
		case !r.Allowed && r.RetryAfter != algo.Never && r.RetryAfter <= 0:
			t.Errorf("at %d: denied with RetryAfter %v", now, r.RetryAfter)
		case r.Remaining < 0 || r.Reset < 0:
			t.Errorf("at %d: %+v", now, r)
		}
		if (isPeek || !r.Allowed) && !equal(s, before) {
			t.Fatalf("at %d: state changed from %+v to %+v by a peek or a denial (%+v)", now, before, s, r)
		}
		if isPeek {
			continue
		}
		checkRemaining(t, p, s, now, r)
		checkReset(t, p, s, now, r)
		if !r.Allowed && r.RetryAfter != algo.Never {
			checkRetryAfter(t, p, s, now, cost, r.RetryAfter.Microseconds())
		}
		if !r.Allowed {
			continue
		}
		if rng.IntN(10) == 0 {
			algo.Refund(p, &s, now, now, cost)
			checkEquivalent(t, p, before, s, now)
			continue
		}
		log = append(log, admission{now, cost})
	}
	return log
}

// checkRemaining checks that exactly r.Remaining more units fit at now.
func checkRemaining(t *testing.T, p algo.Params, s algo.State, now int64, r algo.Result) {
	t.Helper()
	if r.Remaining > 0 && !algo.Decide(p, &s, now, r.Remaining, true).Allowed {
		t.Errorf("at %d: Remaining %d does not fit", now, r.Remaining)
	}
	if algo.Decide(p, &s, now, r.Remaining+1, true).Allowed {
		t.Errorf("at %d: Remaining %d, yet %d fit", now, r.Remaining, r.Remaining+1)
	}
}

// checkReset checks that s is idle from now+r.Reset on, and not before
// when it holds anything.
func checkReset(t *testing.T, p algo.Params, s algo.State, now int64, r algo.Result) {
	t.Helper()
	end := now + r.Reset.Microseconds()
	if !algo.Idle(p, &s, end) {
		t.Errorf("at %d: not idle at Reset %v", now, r.Reset)
	}
	holds := p.Kind != algo.FixedWindow || !algo.Idle(p, &s, now)
	if r.Reset > 0 && holds && algo.Idle(p, &s, end-1) {
		t.Errorf("at %d: idle 1µs before Reset %v", now, r.Reset)
	}
}

// checkRetryAfter checks that, with nothing else happening, cost fits at
// now+wait and not a microsecond earlier.
func checkRetryAfter(t *testing.T, p algo.Params, s algo.State, now, cost, wait int64) {
	t.Helper()
	if !algo.Decide(p, &s, now+wait, cost, true).Allowed {
		t.Errorf("at %d: cost %d denied at RetryAfter %dµs", now, cost, wait)
	}
	if algo.Decide(p, &s, now+wait-1, cost, true).Allowed {
		t.Errorf("at %d: cost %d allowed 1µs before RetryAfter %dµs", now, cost, wait)
	}
}

// checkEquivalent checks that states a and b give the same answers from
// now on, probing a few costs and times.
func checkEquivalent(t *testing.T, p algo.Params, a, b algo.State, now int64) {
	t.Helper()
	per := p.PeriodMicros()
	for _, dt := range []int64{0, 1, per / 3, per / 2, per - 1, per, 2 * per, 3 * per} {
		for cost := int64(1); cost <= p.Capacity(); cost++ {
			ra := algo.Decide(p, &a, now+dt, cost, true)
			rb := algo.Decide(p, &b, now+dt, cost, true)
			if ra != rb {
				t.Errorf("at %d: after a refund, now+%d cost %d gives %+v, before the take %+v", now, dt, cost, rb, ra)
				return
			}
		}
	}
}

// checkBound checks the admissions against the algorithm's bound.
func checkBound(t *testing.T, p algo.Params, log []admission) {
	t.Helper()
	per, limit, capacity := p.PeriodMicros(), p.Limit, p.Capacity()
	switch p.Kind {
	case algo.TokenBucket, algo.GCRA:
		// Token bucket: admitted×P ≤ C×P + elapsed×L over any span.
		// GCRA: admitted×e ≤ C×e + elapsed.
		e := (per + limit - 1) / limit
		for i := range log {
			var sum int64
			for j := i; j < len(log); j++ {
				sum += log[j].cost
				elapsed := log[j].at - log[i].at
				ok := sum*per <= capacity*per+elapsed*limit
				if p.Kind == algo.GCRA {
					ok = sum*e <= capacity*e+elapsed
				}
				if !ok {
					t.Errorf("%d units admitted in [%d, %d]", sum, log[i].at, log[j].at)
					return
				}
			}
		}
	case algo.SlidingLog, algo.Concurrency:
		// At most L in any (t−P, t].
		for j := range log {
			var sum int64
			for i := j; i >= 0 && log[i].at > log[j].at-per; i-- {
				sum += log[i].cost
			}
			if sum > limit {
				t.Errorf("%d units admitted in the period ending at %d", sum, log[j].at)
				return
			}
		}
	case algo.FixedWindow, algo.SlidingCounter:
		// At most L in every window; for the sliding counter, the
		// weighted estimate at every admission is at most L too.
		windows := map[int64]int64{}
		for _, a := range log {
			start := a.at - a.at%per
			windows[start] += a.cost
			if windows[start] > limit {
				t.Errorf("%d units admitted in the window starting at %d", windows[start], start)
				return
			}
			if p.Kind == algo.SlidingCounter {
				e := a.at - start
				if est := windows[start-per]*(per-e) + windows[start]*per; est > limit*per {
					t.Errorf("estimate %d/%d above limit %d at %d", est, per, limit, a.at)
					return
				}
			}
		}
	}
}
