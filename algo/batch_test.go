package algo_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rld/rld/algo"
)

func TestBatch(t *testing.T) {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1}
	check := func(s *algo.State, now int64, costs []int64, wantN int, want algo.Result) {
		t.Helper()
		want.Limit, want.At = 10, now
		n, r := algo.Batch(p, s, now, costs)
		if n != wantN || r != want {
			t.Errorf("Batch(%v) = %d, %+v; want %d, %+v", costs, n, r, wantN, want)
		}
	}
	var s algo.State
	check(&s, t0, []int64{2, 3}, 2, allow(10, 5, 500*ms))
	// The third cost does not fit, the fourth would: deciding stops.
	check(&s, t0, []int64{4, 1, 6, 1}, 2, algo.Result{Remaining: 0, Reset: s1, RetryAfter: 600 * ms})
	check(&s, t0, []int64{1}, 0, deny(10, 0, s1, 100*ms))
	check(&s, t0+200*ms.Microseconds(), []int64{11, 1}, 0, deny(10, 2, 800*ms, algo.Never))
	check(&s, t0+200*ms.Microseconds(), []int64{1, 11}, 1, algo.Result{Remaining: 1, Reset: 900 * ms, RetryAfter: algo.Never})
}

func TestLease(t *testing.T) {
	p := algo.Params{Kind: algo.SlidingCounter, Limit: 10, Period: s1}
	var s algo.State
	check := func(now, want, wantG int64, wantR algo.Result) {
		t.Helper()
		wantR.Limit, wantR.At = 10, now
		g, r := algo.Lease(p, &s, now, want)
		if g != wantG || r != wantR {
			t.Errorf("Lease(%d) at t0+%dµs = %d, %+v; want %d, %+v", want, now-t0, g, r, wantG, wantR)
		}
	}
	check(t0, 4, 4, allow(10, 6, 2*s1))
	check(t0, 0, 1, allow(10, 5, 2*s1)) // a want below 1 counts as 1
	check(t0, 100, 5, allow(10, 0, 2*s1))
	check(t0, 1, 0, deny(10, 0, 2*s1, 1100*ms))
	// Half-way through the next window the 10 weigh 5.
	check(t0+1500*ms.Microseconds(), 7, 5, allow(10, 0, 1500*ms))
}

func TestTakeLease(t *testing.T) {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1}
	var s algo.State
	check := func(now int64, costs []int64, want int64, wantN int, wantL int64, wantR algo.Result) {
		t.Helper()
		wantR.Limit, wantR.At = 10, now
		n, l, r := algo.TakeLease(p, &s, now, costs, want)
		if n != wantN || l != wantL || r != wantR {
			t.Errorf("TakeLease(%v, %d) at t0+%dµs = %d, %d, %+v; want %d, %d, %+v", costs, want, now-t0, n, l, r, wantN, wantL, wantR)
		}
	}
	// 5 taken, 4 leased: the Result is the lease's.
	check(t0, []int64{2, 3}, 4, 2, 4, allow(10, 1, 900*ms))
	// The take empties the bucket: no lease, the Result is the take's.
	check(t0, []int64{1}, 5, 1, 0, allow(10, 0, s1))
	check(t0, []int64{1}, 5, 0, 0, deny(10, 0, s1, 100*ms))
	at := t0 + 250*ms.Microseconds() // 2.5 tokens
	before := s
	check(at, []int64{0}, 0, 1, 0, allow(10, 1, 850*ms)) // want 0: no lease
	s = before
	check(at, []int64{1}, -3, 1, 0, allow(10, 1, 850*ms))
	s = before
	check(at, []int64{1, 11}, 3, 1, 0, algo.Result{Remaining: 1, Reset: 850 * ms, RetryAfter: algo.Never})
	s = before
	check(at, []int64{1}, 3, 1, 1, allow(10, 0, 950*ms)) // a lease of what is left
}

// TestBatchLeaseRandom checks Batch against Decide in a loop, that
// Lease grants exactly the largest cost a take would allow, and that
// TakeLease is a Batch followed, when every cost was admitted, by a Lease,
// on random timelines of every algorithm.
func TestBatchLeaseRandom(t *testing.T) {
	seeds := 100
	if testing.Short() {
		seeds = 10
	}
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			for seed := range seeds {
				rng := rand.New(rand.NewPCG(uint64(seed), 7+uint64(kind)))
				p := randomParams(rng, kind)
				batchLeaseTimeline(t, rng, p)
				if t.Failed() {
					t.Fatalf("seed %d, params %+v", seed, p)
				}
			}
		})
	}
}

func batchLeaseTimeline(t *testing.T, rng *rand.Rand, p algo.Params) {
	t.Helper()
	per, capacity := p.PeriodMicros(), p.Capacity()
	now := int64(t0) + rng.Int64N(per)
	var s algo.State
	for range 200 {
		if rng.IntN(3) > 0 {
			now += rng.Int64N(2*per/p.Limit + 1)
		}
		if rng.IntN(4) == 0 {
			costs := make([]int64, 1+rng.IntN(3))
			for i := range costs {
				costs[i] = rng.Int64N(capacity + 1)
			}
			takeLeaseStep(t, p, &s, now, costs, rng.Int64N(capacity+2))
			if t.Failed() {
				return
			}
			continue
		}
		if rng.IntN(2) == 0 {
			costs := make([]int64, 1+rng.IntN(5))
			for i := range costs {
				costs[i] = 1 + rng.Int64N(capacity+1)
			}
			// The same costs, one Decide at a time.
			want, wantN := clone(s), 0
			var wantR algo.Result
			for _, c := range costs {
				r := algo.Decide(p, &want, now, c, false)
				if !r.Allowed {
					if wantN == 0 {
						wantR = r
					}
					wantR.Allowed, wantR.RetryAfter = false, r.RetryAfter
					break
				}
				wantN++
				wantR = r
			}
			n, r := algo.Batch(p, &s, now, costs)
			if n != wantN || r != wantR || !equal(s, want) {
				t.Errorf("at %d: Batch(%v) = %d, %+v, state %+v; one by one: %d, %+v, state %+v", now, costs, n, r, s, wantN, wantR, want)
				return
			}
			continue
		}
		wantG := 1 + rng.Int64N(capacity+2)
		before := clone(s)
		g, r := algo.Lease(p, &s, now, wantG)
		switch {
		case g < 0 || g > wantG:
			t.Errorf("at %d: Lease(%d) granted %d", now, wantG, g)
		case g == 0 && (r.Allowed || r.RetryAfter <= 0 || !equal(s, before)):
			t.Errorf("at %d: Lease(%d) granted nothing, yet %+v, state %+v → %+v", now, wantG, r, before, s)
		case g == 0 && r != algo.Decide(p, new(clone(before)), now, 1, false):
			t.Errorf("at %d: Lease(%d) granted nothing with %+v, unlike a take of 1", now, wantG, r)
		case g > 0:
			take := clone(before)
			if tr := algo.Decide(p, &take, now, g, false); tr != r || !equal(take, s) {
				t.Errorf("at %d: Lease(%d) granted %d with %+v, state %+v; a take of %d gives %+v, state %+v", now, wantG, g, r, s, g, tr, take)
			}
		}
		if g < wantG && algo.Decide(p, new(clone(before)), now, g+1, true).Allowed {
			t.Errorf("at %d: Lease(%d) granted %d, yet %d fit", now, wantG, g, g+1)
		}
		if t.Failed() {
			return
		}
	}
}

// TestLeaseDurations checks the example of the docs: a lease is a take.
func TestLeaseDurations(t *testing.T) {
	p := algo.Params{Kind: algo.GCRA, Limit: 4, Period: time.Second}
	var s algo.State
	g, r := algo.Lease(p, &s, t0, 3)
	if g != 3 || r.Reset != 750*ms || r.Remaining != 1 {
		t.Fatalf("Lease(3) = %d, %+v", g, r)
	}
}

// takeLeaseStep checks one TakeLease against Batch and Lease.
func takeLeaseStep(t *testing.T, p algo.Params, s *algo.State, now int64, costs []int64, want int64) {
	t.Helper()
	before := clone(*s)
	n, l, r := algo.TakeLease(p, s, now, costs, want)
	batch := clone(before)
	bn, br := algo.Batch(p, &batch, now, costs)
	what := fmt.Sprintf("at %d: TakeLease(%v, %d) on %+v = %d, %d, %+v", now, costs, want, before, n, l, r)
	switch {
	case n != bn:
		t.Errorf("%s; Batch admitted %d", what, bn)
	case l < 0 || l > max(want, 0) || l > 0 && n < len(costs):
		t.Errorf("%s: leased out of range", what)
	case l == 0 && (r != br || !equal(*s, batch)):
		t.Errorf("%s, state %+v; Batch gives %+v, state %+v", what, *s, br, batch)
	case l > 0:
		lease := clone(batch)
		if lg, lr := algo.Lease(p, &lease, now, want); lg != l || lr != r || !equal(*s, lease) {
			t.Errorf("%s, state %+v; Batch then Lease give %d, %+v, state %+v", what, *s, lg, lr, lease)
		}
	}
	if n == len(costs) && l < want && algo.Decide(p, new(clone(batch)), now, l+1, true).Allowed {
		t.Errorf("%s, yet %d more fit", what, l+1)
	}
}
