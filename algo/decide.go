package algo

// Decide decides whether cost units of the limit p fit at now (unix
// microseconds, positive) for the key whose state is s, and consumes them
// from s when they do and peek is false. A denied decision never modifies
// s, and neither does a peek, which returns the Result the same call
// without peek would return. A cost below 1 counts as 1; a cost above
// p.Capacity() is denied with RetryAfter Never.
//
// p must be valid (see Params.Validate). Decide does not allocate, except
// that a SlidingLog's Log may grow.
func Decide(p Params, s *State, now, cost int64, peek bool) Result {
	var r Result
	DecideTo(p, s, now, cost, peek, &r)
	return r
}

// DecideTo is Decide writing its Result to r. On a hot path it is the
// cheaper of the two: a Result is too large to live in registers, and
// copying one that was just written stalls the processor.
func DecideTo(p Params, s *State, now, cost int64, peek bool, r *Result) {
	if cost < 1 {
		cost = 1
	}
	switch p.Kind {
	case TokenBucket:
		tokenBucket(p, s, now, cost, peek, r)
	case GCRA:
		gcra(p, s, now, cost, peek, r)
	case FixedWindow:
		fixedWindow(p, s, now, cost, peek, r)
	case SlidingCounter:
		slidingCounter(p, s, now, cost, peek, r)
	case SlidingLog, Concurrency:
		slidingLog(p, s, now, cost, peek, r)
	default:
		panic("BUG: algo.Decide: unknown " + p.Kind.String())
	}
	r.At = now
}

// Refund gives back cost units that Decide admitted at takenAt, as far as
// the algorithm can still tell them apart at now:
//
//   - TokenBucket: the level rises by cost tokens, up to the capacity.
//   - GCRA: the theoretical arrival time moves back by cost emission
//     intervals, but not before now.
//   - FixedWindow, SlidingCounter: the window's count drops by cost (not
//     below 0) if takenAt lies in the current window; for SlidingCounter
//     the previous window's count drops if takenAt lies in that one (it
//     still weighs on the estimate); otherwise the window has moved on
//     and there is nothing left to refund.
//   - SlidingLog, Concurrency: the entry at takenAt loses cost units, and
//     goes when it has none left (for Concurrency, see Release).
//
// A cost below 1 counts as 1. p must be valid.
func Refund(p Params, s *State, now, takenAt, cost int64) {
	if cost < 1 {
		cost = 1
	}
	cost = min(cost, p.Capacity())
	switch p.Kind {
	case TokenBucket:
		refundTokenBucket(p, s, cost)
	case GCRA:
		refundGCRA(p, s, now, cost)
	case FixedWindow, SlidingCounter:
		refundWindow(p, s, now, takenAt, cost)
	case SlidingLog, Concurrency:
		refundSlidingLog(s, takenAt, cost)
	default:
		panic("BUG: algo.Refund: unknown " + p.Kind.String())
	}
}

// Reset makes s a fresh key's state, one that has admitted nothing. A
// SlidingLog's Log keeps its storage.
func Reset(s *State) {
	*s = State{Log: s.Log[:0]}
}

// Grant adds n units to the quota s has left at now, as if n units
// admitted earlier had not been, and no more than a fresh key has:
//
//   - TokenBucket: the level rises by n tokens, up to the capacity (a
//     fresh bucket is full already).
//   - GCRA: the theoretical arrival time moves back by n emission
//     intervals, but not before now.
//   - FixedWindow: the current window's count drops by n, not below 0.
//   - SlidingCounter: the current window's count drops by n, not below
//     0; the previous window's weight is left alone, so a grant right
//     after a window change may add less than n.
//   - SlidingLog, Concurrency: the live admissions lose n units, oldest
//     first; an entry left with none goes.
//
// It is Refund of units taken at now for every algorithm but SlidingLog
// and Concurrency.
// An n below 1 counts as 1. p must be valid.
func Grant(p Params, s *State, now, n int64) {
	if n < 1 {
		n = 1
	}
	n = min(n, p.Capacity())
	if p.Kind != SlidingLog && p.Kind != Concurrency {
		Refund(p, s, now, now, n)
		return
	}
	first := 0
	for first < len(s.Log) && s.Log[first].At <= now-p.PeriodMicros() {
		first++
	}
	i := first
	for ; i < len(s.Log) && n > 0; i++ {
		k := min(n, s.Log[i].Cost)
		n -= k
		if s.Log[i].Cost -= k; s.Log[i].Cost > 0 {
			break
		}
	}
	// Entries first … i−1 are spent; the dead ones before first go too.
	s.Log = s.Log[:copy(s.Log, s.Log[i:])]
}

// Idle reports whether s is, at now, equivalent to a fresh key's state, so
// that a store may delete it: a full token bucket, a GCRA arrival time not
// after now, a fixed window that is over or empty, a sliding counter whose
// estimate is 0, a sliding log or a concurrency limit with no live entry.
//
// A state stays idle as time passes, and the state a decision leaves
// behind is idle from Result.Reset after the decision on.
func Idle(p Params, s *State, now int64) bool {
	switch p.Kind {
	case TokenBucket:
		full := p.Capacity() * p.PeriodMicros()
		return tokenLevel(s, now, full, p.Limit) == full
	case GCRA:
		return s.A <= now
	case FixedWindow:
		return s.B == 0 || s.A+p.PeriodMicros() <= now
	case SlidingCounter:
		per := p.PeriodMicros()
		cur, prev := windowCounts(s, now-now%per, per)
		return cur == 0 && prev == 0
	case SlidingLog, Concurrency:
		n := len(s.Log)
		return n == 0 || s.Log[n-1].At <= now-p.PeriodMicros()
	}
	panic("BUG: algo.Idle: unknown " + p.Kind.String())
}
