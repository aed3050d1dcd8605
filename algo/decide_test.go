package algo_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rld/rld/algo"
)

// t0 is a unix time in µs aligned to the hour, so that every window in the
// tables below starts at an offset that is a round number.
const t0 = 1_699_999_200_000_000

const (
	us = time.Microsecond
	ms = time.Millisecond
	s1 = time.Second
)

type op uint8

const (
	take op = iota
	peek
	refund
)

// step is one event of a timeline: a take or peek of cost at t0+at that
// must return want, or a refund of cost taken at t0+takenAt.
type step struct {
	at      time.Duration
	op      op
	cost    int64
	takenAt time.Duration
	want    algo.Result
}

// allow and deny build the expected Results of a table.
func allow(limit, remaining int64, reset time.Duration) algo.Result {
	return algo.Result{Allowed: true, Limit: limit, Remaining: remaining, Reset: reset}
}

func deny(limit, remaining int64, reset, retry time.Duration) algo.Result {
	return algo.Result{Limit: limit, Remaining: remaining, Reset: reset, RetryAfter: retry}
}

func TestDecideTimelines(t *testing.T) {
	tests := []struct {
		name  string
		p     algo.Params
		steps []step
	}{{
		name: "token bucket: burst, refill, cost above capacity",
		p:    algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1},
		steps: []step{
			{at: 0, cost: 1, want: allow(10, 9, 100*ms)},
			{at: 0, cost: 9, want: allow(10, 0, s1)},
			{at: 0, cost: 1, want: deny(10, 0, s1, 100*ms)},
			{at: 50 * ms, cost: 1, want: deny(10, 0, 950*ms, 50*ms)},
			{at: 100 * ms, op: peek, cost: 1, want: allow(10, 0, s1)},
			{at: 100 * ms, cost: 1, want: allow(10, 0, s1)},
			{at: 100 * ms, cost: 11, want: deny(10, 0, s1, algo.Never)},
			{at: 2 * s1, cost: 3, want: allow(10, 7, 300*ms)},
		},
	}, {
		name: "token bucket: burst above rate, cost > 1, refund",
		p:    algo.Params{Kind: algo.TokenBucket, Limit: 1, Period: s1, Burst: 5},
		steps: []step{
			{at: 0, cost: 5, want: allow(5, 0, 5*s1)},
			{at: 0, cost: 1, want: deny(5, 0, 5*s1, s1)},
			{at: s1, cost: 2, want: deny(5, 1, 4*s1, s1)},
			{at: 2 * s1, cost: 2, want: allow(5, 0, 5*s1)},
			{at: 2 * s1, op: refund, cost: 1, takenAt: 2 * s1},
			{at: 2 * s1, op: peek, cost: 1, want: allow(5, 0, 5*s1)},
			{at: 2 * s1, cost: 2, want: deny(5, 1, 4*s1, s1)},
			{at: 2 * s1, op: refund, cost: 9, takenAt: 2 * s1},
			{at: 2 * s1, cost: 5, want: allow(5, 0, 5*s1)},
		},
	}, {
		name: "gcra: burst, spacing, refund",
		p:    algo.Params{Kind: algo.GCRA, Limit: 10, Period: s1},
		steps: []step{
			{at: 0, cost: 1, want: allow(10, 9, 100*ms)},
			{at: 0, cost: 9, want: allow(10, 0, s1)},
			{at: 0, cost: 1, want: deny(10, 0, s1, 100*ms)},
			{at: 100 * ms, cost: 1, want: allow(10, 0, s1)},
			{at: 100 * ms, cost: 11, want: deny(10, 0, s1, algo.Never)},
			{at: 100 * ms, op: refund, cost: 2, takenAt: 100 * ms},
			{at: 100 * ms, op: peek, cost: 2, want: allow(10, 0, s1)},
			{at: 100 * ms, cost: 1, want: allow(10, 1, 900*ms)},
			{at: 5 * s1, op: refund, cost: 1, takenAt: 100 * ms},
			{at: 5 * s1, cost: 1, want: allow(10, 9, 100*ms)},
		},
	}, {
		name: "gcra: emission interval rounds up",
		p:    algo.Params{Kind: algo.GCRA, Limit: 3, Period: s1},
		steps: []step{
			{at: 0, cost: 3, want: allow(3, 0, 1000002*us)},
			{at: 0, cost: 1, want: deny(3, 0, 1000002*us, 333334*us)},
			{at: 333333 * us, cost: 1, want: deny(3, 0, 666669*us, 1*us)},
			{at: 333334 * us, cost: 1, want: allow(3, 0, 1000002*us)},
		},
	}, {
		name: "fixed window: 2×limit across a boundary",
		p:    algo.Params{Kind: algo.FixedWindow, Limit: 3, Period: s1},
		steps: []step{
			{at: 0, cost: 1, want: allow(3, 2, s1)},
			{at: 998 * ms, op: peek, cost: 2, want: allow(3, 0, 2*ms)},
			{at: 999 * ms, cost: 3, want: deny(3, 2, ms, ms)},
			{at: 999 * ms, cost: 2, want: allow(3, 0, ms)},
			{at: 999 * ms, cost: 1, want: deny(3, 0, ms, ms)},
			{at: s1, cost: 3, want: allow(3, 0, s1)}, // 5 units within 1ms
			{at: s1, cost: 4, want: deny(3, 0, s1, algo.Never)},
			{at: 1500 * ms, op: refund, cost: 1, takenAt: 999 * ms}, // window gone
			{at: 1500 * ms, op: refund, cost: 2, takenAt: s1},
			{at: 1500 * ms, cost: 2, want: allow(3, 0, 500*ms)},
			{at: 1500 * ms, cost: 1, want: deny(3, 0, 500*ms, 500*ms)},
		},
	}, {
		name: "sliding counter: the previous window's weight",
		p:    algo.Params{Kind: algo.SlidingCounter, Limit: 10, Period: s1},
		steps: []step{
			{at: 0, cost: 10, want: allow(10, 0, 2*s1)},
			// Full window: fits in the next one once the weight of 10
			// drops to 9, 100ms into it.
			{at: 500 * ms, cost: 1, want: deny(10, 0, 1500*ms, 600*ms)},
			{at: 1099 * ms, cost: 1, want: deny(10, 0, 901*ms, ms)},
			{at: 1250 * ms, cost: 2, want: allow(10, 0, 1750*ms)},
			{at: 1250 * ms, cost: 1, want: deny(10, 0, 1750*ms, 50*ms)},
			{at: 1300 * ms, cost: 1, want: allow(10, 0, 1700*ms)},
			{at: 1900 * ms, cost: 1, want: allow(10, 5, 1100*ms)},
			{at: 2 * s1, op: peek, cost: 1, want: allow(10, 5, 2*s1)},
			// The previous window's 4 weigh 4 at its end, 3 a quarter later.
			{at: 2 * s1, cost: 11, want: deny(10, 6, s1, algo.Never)},
			{at: 2 * s1, cost: 7, want: deny(10, 6, s1, 250*ms)},
			{at: 2 * s1, op: refund, cost: 1, takenAt: 900 * ms}, // window gone
			{at: 2 * s1, cost: 6, want: allow(10, 0, 2*s1)},
			{at: 2500 * ms, op: refund, cost: 2, takenAt: 2 * s1},
			{at: 2500 * ms, cost: 4, want: allow(10, 0, 1500*ms)},
			{at: 3500 * ms, cost: 7, want: deny(10, 6, 500*ms, 125*ms)},
			{at: 4500 * ms, cost: 10, want: allow(10, 0, 1500*ms)},
		},
	},
		{
			name: "sliding counter: a refund of the previous window",
			p:    algo.Params{Kind: algo.SlidingCounter, Limit: 10, Period: s1},
			steps: []step{
				{at: 900 * ms, cost: 8, want: allow(10, 2, 1100*ms)},
				// At 1s the previous window's 8 weigh 8: 2 fit.
				{at: 1 * s1, cost: 3, want: deny(10, 2, s1, 125*ms)},
				// Units taken at 900ms given back at 1s: that window's count
				// drops, its weight with it.
				{at: 1 * s1, op: refund, cost: 3, takenAt: 900 * ms},
				{at: 1 * s1, cost: 5, want: allow(10, 0, 2*s1)},
				// And from a state whose current window is the previous one.
				{at: 2100 * ms, op: refund, cost: 2, takenAt: 1 * s1},
				{at: 2100 * ms, cost: 1, want: allow(10, 6, 1900*ms)},
			},
		}, {
			name: "sliding log: exact",
			p:    algo.Params{Kind: algo.SlidingLog, Limit: 3, Period: s1},
			steps: []step{
				{at: 0, cost: 1, want: allow(3, 2, s1)},
				{at: 200 * ms, cost: 1, want: allow(3, 1, s1)},
				{at: 200 * ms, cost: 1, want: allow(3, 0, s1)},
				{at: 500 * ms, cost: 1, want: deny(3, 0, 700*ms, 500*ms)},
				{at: 500 * ms, cost: 2, want: deny(3, 0, 700*ms, 700*ms)},
				{at: 999999 * us, cost: 1, want: deny(3, 0, 200001*us, us)},
				{at: s1, cost: 1, want: allow(3, 0, s1)},
				{at: s1, cost: 4, want: deny(3, 0, s1, algo.Never)},
				{at: 1100 * ms, op: refund, cost: 1, takenAt: 200 * ms},
				{at: 1100 * ms, op: peek, cost: 1, want: allow(3, 0, s1)},
				{at: 1100 * ms, cost: 1, want: allow(3, 0, s1)},
				{at: 1200 * ms, cost: 1, want: allow(3, 0, s1)},
				{at: 1200 * ms, op: refund, cost: 1, takenAt: 1200 * ms},
				{at: 1200 * ms, op: refund, cost: 1, takenAt: 1100 * ms},
				{at: 1200 * ms, cost: 2, want: allow(3, 0, s1)},
			},
		}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.p.Validate(); err != nil {
				t.Fatal(err)
			}
			var s algo.State
			for i, st := range tt.steps {
				now := t0 + st.at.Microseconds()
				if st.op == refund {
					algo.Refund(tt.p, &s, now, t0+st.takenAt.Microseconds(), st.cost)
					continue
				}
				before := clone(s)
				got := algo.Decide(tt.p, &s, now, st.cost, st.op == peek)
				st.want.At = now
				if got != st.want {
					t.Errorf("step %d (at %v, cost %d): got %+v, want %+v", i, st.at, st.cost, got, st.want)
				}
				if (st.op == peek || !got.Allowed) && !equal(s, before) {
					t.Errorf("step %d: state changed from %+v to %+v by a peek or a denial", i, before, s)
				}
			}
		})
	}
}

func TestDecideCostBelowOne(t *testing.T) {
	p := algo.Params{Kind: algo.FixedWindow, Limit: 2, Period: s1}
	var s algo.State
	for _, cost := range []int64{0, -5} {
		if r := algo.Decide(p, &s, t0, cost, false); !r.Allowed {
			t.Fatalf("cost %d denied: %+v", cost, r)
		}
	}
	if r := algo.Decide(p, &s, t0, 0, false); r.Allowed {
		t.Fatalf("third unit allowed: %+v", r)
	}
}

func TestIdle(t *testing.T) {
	tests := []struct {
		p     algo.Params
		after time.Duration // idle from t0+after on, after a take of 1 at t0+1ms
	}{
		{algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: s1}, 101 * ms},
		{algo.Params{Kind: algo.GCRA, Limit: 10, Period: s1}, 101 * ms},
		{algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: s1}, s1},
		{algo.Params{Kind: algo.SlidingCounter, Limit: 10, Period: s1}, 2 * s1},
		{algo.Params{Kind: algo.SlidingLog, Limit: 10, Period: s1}, 1001 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.p.Kind.String(), func(t *testing.T) {
			var s algo.State
			if !algo.Idle(tt.p, &s, t0) {
				t.Error("fresh state not idle")
			}
			start := t0 + ms.Microseconds()
			r := algo.Decide(tt.p, &s, start, 1, false)
			if got := start + r.Reset.Microseconds(); got != t0+tt.after.Microseconds() {
				t.Errorf("Reset ends at t0+%dµs, want t0+%v", got-t0, tt.after)
			}
			end := t0 + tt.after.Microseconds()
			if algo.Idle(tt.p, &s, end-1) {
				t.Errorf("idle at t0+%v−1µs", tt.after)
			}
			if !algo.Idle(tt.p, &s, end) {
				t.Errorf("not idle at t0+%v", tt.after)
			}
		})
	}
}

func TestDecideAllocs(t *testing.T) {
	for _, kind := range kinds {
		p := algo.Params{Kind: kind, Limit: 100, Period: s1}
		var s algo.State
		now := int64(t0)
		algo.Decide(p, &s, now, 1, false) // a sliding log's first entry allocates
		allocs := testing.AllocsPerRun(1000, func() {
			now += 10_000
			algo.Decide(p, &s, now, 1, false)
		})
		if allocs != 0 {
			t.Errorf("%v: %v allocs per Decide, want 0", kind, allocs)
		}
	}
}

func BenchmarkDecide(b *testing.B) {
	for _, kind := range kinds {
		b.Run(kind.String(), func(b *testing.B) {
			p := algo.Params{Kind: kind, Limit: 100, Period: s1}
			var s algo.State
			now := int64(t0)
			b.ReportAllocs()
			for b.Loop() {
				now += 7_000 // about 70% of calls are allowed
				algo.Decide(p, &s, now, 1, false)
			}
		})
	}
}

func ExampleDecide() {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 2, Period: time.Second}
	var s algo.State
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for range 3 {
		r := algo.Decide(p, &s, now, 1, false)
		fmt.Printf("allowed=%v remaining=%d reset=%v retry-after=%v\n", r.Allowed, r.Remaining, r.Reset, r.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1 reset=500ms retry-after=0s
	// allowed=true remaining=0 reset=1s retry-after=0s
	// allowed=false remaining=0 reset=1s retry-after=500ms
}

var kinds = []algo.Kind{algo.TokenBucket, algo.GCRA, algo.FixedWindow, algo.SlidingCounter, algo.SlidingLog, algo.Concurrency}

func clone(s algo.State) algo.State {
	s.Log = slices.Clone(s.Log)
	return s
}

func equal(a, b algo.State) bool {
	return a.A == b.A && a.B == b.B && a.C == b.C && slices.Equal(a.Log, b.Log)
}
