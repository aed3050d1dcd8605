package algo

import "math/bits"

// tokenBucket decides for a TokenBucket. The level counts tokens × period
// in µs: one token is P units, a full bucket C×P, and the bucket refills L
// units per µs, so that every quantity is an integer.
func tokenBucket(p Params, s *State, now, cost int64, peek bool, r *Result) {
	per, capacity := p.PeriodMicros(), p.Capacity()
	full := capacity * per
	level := tokenLevel(s, now, full, p.Limit)
	*r = Result{Limit: capacity}
	switch {
	case cost > capacity:
		r.RetryAfter = Never
	case level >= cost*per:
		level -= cost * per
		r.Allowed = true
		if !peek {
			// max: a clock that steps back must not refill twice.
			s.A, s.B = level, max(s.B, now)
		}
	default:
		r.RetryAfter = micros(ceilDiv(cost*per-level, p.Limit))
	}
	r.Remaining = max(level, 0) / per // a charge may leave a debt
	r.Reset = micros(ceilDiv(full-level, p.Limit))
}

// tokenLevel returns the level of the bucket s at now: the stored level
// plus L per µs since the last update, capped at full. A fresh bucket is
// full. It never forms a product above full, so the Lua scripts' doubles
// stay exact.
func tokenLevel(s *State, now, full, rate int64) int64 {
	if s.B == 0 || s.A >= full {
		return full
	}
	elapsed := now - s.B
	if elapsed <= 0 {
		return s.A
	}
	// elapsed×rate as a 128-bit product: no division, no overflow. (The
	// Lua script compares elapsed with ⌈(full−level)/rate⌉ instead, which
	// decides the same.)
	hi, lo := bits.Mul64(uint64(elapsed), uint64(rate))
	if hi != 0 || lo >= uint64(full-s.A) {
		return full
	}
	return s.A + int64(lo)
}

func refundTokenBucket(p Params, s *State, cost int64) {
	if s.B == 0 {
		return // fresh: already full
	}
	// Adding to the stored level and refilling later gives the same level
	// as refilling first: both are capped at full.
	full := p.Capacity() * p.PeriodMicros()
	s.A = min(s.A+cost*p.PeriodMicros(), full)
}
