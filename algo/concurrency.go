package algo

// Concurrency shares SlidingLog's decision: the units held, those admitted
// in (now−P, now] and not released, plus cost must not exceed L. Each
// admission is one Entry of State.Log, named by its time At (the Result.At
// of the take that admitted it): the lease id a caller gives back to
// Release. Admissions at one microsecond share an Entry, as in the log, and
// a release of one of them takes its own units off it.

// Release gives back cost units of the admission made at at (its
// Result.At), which still holds them at now, and reports whether there was
// one. An admission that has expired (at ≤ now−P), was released already,
// or never was, changes nothing and gives false. A cost below 1 counts as
// 1; more than the entry holds releases the entry. p must be valid.
func Release(p Params, s *State, now, at, cost int64) bool {
	if at <= now-p.PeriodMicros() {
		return false
	}
	cost = max(cost, 1)
	for i := len(s.Log) - 1; i >= 0 && s.Log[i].At >= at; i-- {
		if s.Log[i].At != at {
			continue
		}
		if s.Log[i].Cost -= cost; s.Log[i].Cost <= 0 {
			s.Log = append(s.Log[:i], s.Log[i+1:]...)
		}
		return true
	}
	return false
}
