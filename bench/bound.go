package main

import (
	"fmt"
	"sync/atomic"
	"time"
)

// Algorithms of the spawned daemon's rule (-algorithm), as rld.toml
// names them.
const (
	algTokenBucket    = "token_bucket"
	algGCRA           = "gcra"
	algFixedWindow    = "fixed_window"
	algSlidingCounter = "sliding_counter"
	algSlidingLog     = "sliding_log"
)

// boundMargin widens a run's span at its end, for the bound: the last
// answer's time is read on the monotonic clock and the bound is counted
// on the wall clock, which Redis's time follows.
const boundMargin = time.Millisecond

// algorithms are the values -algorithm accepts.
var algorithms = []string{algTokenBucket, algGCRA, algFixedWindow, algSlidingCounter, algSlidingLog}

// boundRule is the rule a bound check holds a target's answers to: its
// algorithm, limit per period, and capacity (a bucket's burst; the
// spawned rule sets none, so it is the limit).
type boundRule struct {
	alg    string
	limit  int64
	period time.Duration
}

// bound returns the most the rule may admit on one counter between the
// unix µs first and last: every admission of a run happened in the
// store between the first request sent and the last answer received.
// The bounds are the exact algorithms' (those of the daemon's fleet
// tests): a bucket starts at most full and refills at the rate; a
// window admits at most the limit in each window touched.
func (r boundRule) bound(first, last int64) int64 {
	per := r.period.Microseconds()
	switch r.alg {
	case algTokenBucket:
		// admitted×P ≤ C×P + elapsed×L
		return r.limit + (last-first)*r.limit/per
	case algGCRA:
		// admitted×e ≤ C×e + elapsed, e = ⌈P/L⌉
		e := (per + r.limit - 1) / r.limit
		return r.limit + (last-first)/e
	case algSlidingLog:
		// At most L in any (t−P, t]: ⌈(last−first+1)/P⌉ such spans
		// cover the run.
		return r.limit * ((last - first + per) / per)
	}
	// Fixed window, sliding counter: at most L in each epoch-aligned
	// window touched (the counter's estimate never lets a window's own
	// count pass L).
	return r.limit * (last/per - first/per + 1)
}

// boundCheck counts the allowed answers of each counter over a run,
// warm-up included, to compare each count with the rule's bound over
// the run. Safe for concurrent use.
type boundCheck struct {
	rule  boundRule
	keyed bool // each key number is a counter of its own; else all share one
	// allowed counts the allowed answers by counter.
	allowed []atomic.Int64
	// first and last are unix µs: before the first request was sent and
	// after the last answer was received.
	first, last int64
}

// newBoundCheck returns the check of a run of keys key numbers against
// rule; keyed says whether the key number makes the counter (the
// descriptors hold {n}).
func newBoundCheck(rule boundRule, keys int, keyed bool) *boundCheck {
	if !keyed {
		keys = 1
	}
	return &boundCheck{rule: rule, keyed: keyed, allowed: make([]atomic.Int64, keys)}
}

// admit counts an allowed answer of key number key.
func (b *boundCheck) admit(key int) {
	if !b.keyed {
		key = 0
	}
	b.allowed[key].Add(1)
}

// Bound is what a run's bound check found: the allowed answers of each
// counter against the most the rule lets one counter admit over the
// run (see boundRule.bound).
type Bound struct {
	// Rule is the rule's algorithm and limit, e.g. "token_bucket 100 per 1s".
	Rule string `json:"rule"`
	// Seconds is the length of the run, warm-up included, over which the
	// answers were counted.
	Seconds float64 `json:"seconds"`
	// Limit is the bound of every counter over the run.
	Limit int64 `json:"bound"`
	// Counters is how many counters had an allowed answer.
	Counters int64 `json:"counters"`
	// MostAllowed is the most allowed answers of one counter.
	MostAllowed int64 `json:"most_allowed"`
	// AtLimit is how many counters reached at least 90% of the bound:
	// the keys pushed past their limit.
	AtLimit int64 `json:"at_limit"`
	// Over is how many counters were allowed more than the bound: any
	// is a bug.
	Over int64 `json:"over"`
}

// result summarises the counts.
func (b *boundCheck) result() *Bound {
	limit := b.rule.bound(b.first, b.last)
	r := &Bound{
		Rule:    fmt.Sprintf("%s %d per %v", b.rule.alg, b.rule.limit, b.rule.period),
		Seconds: float64(b.last-b.first) / 1e6, Limit: limit,
	}
	for i := range b.allowed {
		n := b.allowed[i].Load()
		if n == 0 {
			continue
		}
		r.Counters++
		r.MostAllowed = max(r.MostAllowed, n)
		if 10*n >= 9*limit {
			r.AtLimit++
		}
		if n > limit {
			r.Over++
		}
	}
	return r
}
