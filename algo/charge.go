package algo

// Charge consumes n units of the limit p at now without deciding: units
// already used, such as the part of a settled cost above its estimate. They
// are taken whether they fit or not, so the key may go into debt: its
// later decisions are refused, with their exact RetryAfter, until it has
// refilled (or its windows have moved on). n is at least 1 and at most the
// capacity, and the debt at most one capacity, so that every value stays
// within the exact range of the Lua scripts:
//
//   - TokenBucket: the level drops by n×P, to −C×P at the lowest.
//   - GCRA: the theoretical arrival time moves on by n×e, to now + 2×C×e
//     at the latest.
//   - FixedWindow, SlidingCounter: the current window's count rises by n,
//     to 2×L at most.
//   - SlidingLog, Concurrency: n units are logged at now (joining the
//     newest entry as an admission does), up to 2×L live units.
//
// p must be valid.
func Charge(p Params, s *State, now, n int64) {
	capacity := p.Capacity()
	n = min(max(n, 1), capacity)
	per := p.PeriodMicros()
	switch p.Kind {
	case TokenBucket:
		full := capacity * per
		level := tokenLevel(s, now, full, p.Limit)
		s.A, s.B = max(level-n*per, -full), max(s.B, now)
	case GCRA:
		e := emission(p)
		s.A = min(max(s.A, now)+n*e, now+2*capacity*e)
	case FixedWindow:
		start := now - now%per
		var count int64
		if s.A == start {
			count = s.B
		}
		s.A, s.B = start, min(count+n, 2*p.Limit)
	case SlidingCounter:
		start := now - now%per
		cur, prev := windowCounts(s, start, per)
		s.A, s.B, s.C = start, min(cur+n, 2*p.Limit), prev
	case SlidingLog, Concurrency:
		first := 0
		for first < len(s.Log) && s.Log[first].At <= now-per {
			first++
		}
		var sum int64
		for _, en := range s.Log[first:] {
			sum += en.Cost
		}
		if add := min(n, 2*p.Limit-sum); add > 0 {
			s.Log = appendLog(s.Log[:copy(s.Log, s.Log[first:])], now, add)
		}
	default:
		panic("BUG: algo.Charge: unknown " + p.Kind.String())
	}
}
