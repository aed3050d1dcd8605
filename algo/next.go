package algo

import "time"

// Next returns how long after the decision r of limit p the available
// quota grows past r.Remaining with no further traffic: the effective
// window of the IETF RateLimit field's t parameter, within which a client
// can use no more than r.Remaining units. It is derived from r and p
// alone, never later than r.RetryAfter when r was denied, and it is
// rounded up (by at most 2 µs), so a denied client that waits Next finds
// at least one unit:
//
//   - TokenBucket, GCRA: until the next unit comes back, one every
//     Period/Limit (for a full bucket, one such interval);
//   - FixedWindow: until the window ends;
//   - SlidingCounter, SlidingLog, when denied: r.RetryAfter; when
//     allowed, -1 (unknown): their quota comes back entry by entry, at
//     times a Result does not carry.
//
// A denial with RetryAfter Never, and a p that is not valid, also give -1.
func Next(p Params, r *Result) time.Duration {
	if r.RetryAfter == Never || p.Limit <= 0 || p.PeriodMicros() <= 0 {
		return -1
	}
	var next time.Duration
	switch p.Kind {
	case TokenBucket, GCRA:
		k := r.Limit - r.Remaining - 1 // units between this one and a full bucket
		n := k
		if k < 0 {
			n = 1
		}
		// n unit intervals: Period/Limit for the bucket, GCRA's emission
		// interval e (an integer number of µs). Computed inline, not by
		// a closure: Next is on the hot path of every answer.
		var u int64
		if p.Kind == GCRA {
			u = n * emission(p)
		} else {
			u = n * p.PeriodMicros() / p.Limit
		}
		if k < 0 {
			next = micros(u + 1) // full: one interval, rounded up
		} else {
			next = max(r.Reset-micros(u), 0)
		}
	case FixedWindow:
		next = r.Reset
	default:
		if r.Allowed {
			return -1
		}
		next = r.RetryAfter
	}
	if !r.Allowed {
		next = min(next, r.RetryAfter)
	}
	return next
}

// Sustained returns the quota of limit p as the IETF RateLimit-Policy
// field advertises it: q units per w such that a client spacing its
// requests evenly at q per w is never refused. It is Limit per Period for
// every algorithm but SlidingCounter, whose estimate weighs the previous
// window's count as if spread evenly over it: a client paced at exactly
// Limit per Period is refused at its first request of each window (its
// count there is one above the estimate's share). One unit less per
// Period is never refused; with a Limit of 1, one unit per two Periods.
func Sustained(p Params) (q int64, w time.Duration) {
	if p.Kind != SlidingCounter {
		return p.Limit, p.Period
	}
	if p.Limit < 2 {
		return p.Limit, 2 * p.Period
	}
	return p.Limit - 1, p.Period
}
