package algo

// emission returns GCRA's emission interval e = ⌈P/L⌉ µs, rounded up so
// that the limit is never exceeded.
func emission(p Params) int64 { return ceilDiv(p.PeriodMicros(), p.Limit) }

// gcra decides for GCRA. The state is the theoretical arrival time (TAT):
// the time at which the key would be idle again. A request of cost units
// fits when pushing the TAT by cost×e keeps it within C×e of now.
func gcra(p Params, s *State, now, cost int64, peek bool, r *Result) {
	capacity, e := p.Capacity(), emission(p)
	burst := capacity * e
	tat := max(s.A, now)
	*r = Result{Limit: capacity}
	switch {
	case cost > capacity:
		r.RetryAfter = Never
	case tat+cost*e-now <= burst:
		tat += cost * e
		r.Allowed = true
		if !peek {
			s.A = tat
		}
	default:
		r.RetryAfter = micros(tat + cost*e - now - burst)
	}
	r.Remaining = max(burst-(tat-now), 0) / e
	r.Reset = micros(tat - now)
}

func refundGCRA(p Params, s *State, now, cost int64) {
	if s.A > now {
		s.A = max(s.A-cost*emission(p), now)
	}
}
