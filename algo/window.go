package algo

// fixedWindow decides for FixedWindow: at most L units in each window
// [start, start+P), with windows aligned to the unix epoch.
func fixedWindow(p Params, s *State, now, cost int64, peek bool, r *Result) {
	per, limit := p.PeriodMicros(), p.Limit
	start := now - now%per
	var count int64
	if s.A == start {
		count = s.B
	}
	*r = Result{Limit: limit, Reset: micros(start + per - now)}
	switch {
	case cost > limit:
		r.RetryAfter = Never
	case count+cost <= limit:
		count += cost
		r.Allowed = true
		if !peek {
			s.A, s.B = start, count
		}
	default:
		r.RetryAfter = r.Reset
	}
	r.Remaining = max(limit-count, 0)
}

// slidingCounter decides for SlidingCounter: the count of the previous
// window, weighted by the part of it that a sliding window ending at now
// still covers, plus the current window's count, must not exceed L. In
// integers: prev×(P−e) + cur×P ≤ L×P, with e = now − start.
func slidingCounter(p Params, s *State, now, cost int64, peek bool, r *Result) {
	per, limit := p.PeriodMicros(), p.Limit
	start := now - now%per
	e := now - start
	cur, prev := windowCounts(s, start, per)
	weighted := prev * (per - e)
	*r = Result{Limit: limit}
	switch {
	case cost > limit:
		r.RetryAfter = Never
	// Checked as two comparisons so that no side exceeds L×P.
	case cur+cost <= limit && weighted <= (limit-cur-cost)*per:
		cur += cost
		r.Allowed = true
		if !peek {
			s.A, s.B, s.C = start, cur, prev
		}
	case cur+cost <= limit:
		// The previous window's weight must shrink: prev×(P−e−w) ≤
		// (L−cur−cost)×P. prev > 0 here. At the latest it fits at the
		// next window's start, where prev' = cur and cur' = 0.
		r.RetryAfter = micros(per - e - (limit-cur-cost)*per/prev)
	default:
		// It fits in the next window at e' with cur×(P−e') ≤ (L−cost)×P
		// (cur > 0 here), or at the latest at the start of the one after.
		r.RetryAfter = micros(per - e + per - (limit-cost)*per/cur)
	}
	r.Remaining = max(limit-cur-ceilDiv(weighted, per), 0)
	switch {
	case cur > 0:
		r.Reset = micros(start + 2*per - now)
	case prev > 0:
		r.Reset = micros(start + per - now)
	}
}

// windowCounts returns the counts of the window that starts at start and
// of the one before it, from a SlidingCounter state.
func windowCounts(s *State, start, per int64) (cur, prev int64) {
	switch s.A {
	case start:
		return s.B, s.C
	case start - per:
		return 0, s.B
	}
	return 0, 0
}

func refundWindow(p Params, s *State, now, takenAt, cost int64) {
	per := p.PeriodMicros()
	start := now - now%per
	taken := takenAt - takenAt%per
	switch {
	case s.A == start && taken == start:
		s.B = max(s.B-cost, 0)
	case p.Kind == SlidingCounter && taken == start-per && s.A == start:
		// The previous window still weighs on a sliding counter's
		// estimate: its count drops.
		s.C = max(s.C-cost, 0)
	case p.Kind == SlidingCounter && taken == start-per && s.A == start-per:
		s.B = max(s.B-cost, 0)
	}
}
