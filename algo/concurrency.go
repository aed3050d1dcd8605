package algo

// Concurrency shares SlidingLog's decision: the units held, those admitted
// in (now−P, now] and not released, plus cost must not exceed L. Each
// admission is one Entry of State.Log. An acquire (Acquire, OpAcquire)
// holds one slot named by its Slot, an id its caller chose, unique among
// the key's admissions: the Entry of that slot is its own, whatever
// other admissions share its microsecond, and a release names it by
// (At, Slot). Admissions with no slot id (a take, a charge) share one
// Entry per microsecond, as in the log, with Slot 0. Entries are kept in
// (At, Slot) order, which is the order of their members in Redis.

// Acquire decides one slot of the Concurrency limit p at now and, when it
// fits, holds it as the admission named slot (non-zero, and not held by
// the key already: ids are the caller's to keep unique). The slot's time,
// r.At, is now, or the newest live admission's time when that is later
// (a clock that stepped back): a release names the slot by r.At and slot.
// A slot of 0 is a take of cost 1 (Decide). p must be valid.
func Acquire(p Params, s *State, now int64, slot uint64, r *Result) {
	if slot == 0 {
		DecideTo(p, s, now, 1, false, r)
		return
	}
	slidingLog(p, s, now, 1, true, r)
	r.At = now
	if !r.Allowed {
		return
	}
	per := p.PeriodMicros()
	first := 0
	for first < len(s.Log) && s.Log[first].At <= now-per {
		first++
	}
	log := s.Log[:copy(s.Log, s.Log[first:])]
	at := now
	if n := len(log); n > 0 && log[n-1].At > at {
		at = log[n-1].At
	}
	i := len(log)
	for i > 0 && log[i-1].At == at && log[i-1].Slot > slot {
		i--
	}
	log = append(log, Entry{})
	copy(log[i+1:], log[i:])
	log[i] = Entry{At: at, Cost: 1, Slot: slot}
	s.Log, r.At = log, at
}

// AcquireBatch acquires one slot per id of slots in order, as Batch takes
// costs: the longest prefix that fits is held, and deciding stops at the
// first denial. Its Result is Batch's; its At is the admitted slots'
// time (they share one), or now when none was admitted. slots must not be
// empty; p must be valid.
func AcquireBatch(p Params, s *State, now int64, slots []uint64) (admitted int, r Result) {
	if len(slots) == 0 {
		panic("BUG: algo.AcquireBatch: no slots")
	}
	var d Result
	for _, slot := range slots {
		Acquire(p, s, now, slot, &d)
		if !d.Allowed {
			if admitted == 0 {
				return 0, d
			}
			r.Allowed, r.RetryAfter = false, d.RetryAfter
			return admitted, r
		}
		admitted++
		r = d
	}
	return admitted, r
}

// Release gives back cost units of the admission named at (its
// Result.At) and slot (0 for one that Decide admitted), which still holds
// them at now, and reports whether there was one. An admission that has
// expired (at ≤ now−P), was released already, or never was, changes
// nothing and gives false; a release never frees another admission's
// units. A cost below 1 counts as 1; more than the entry holds releases
// the entry. p must be valid.
func Release(p Params, s *State, now, at int64, slot uint64, cost int64) bool {
	if at <= now-p.PeriodMicros() {
		return false
	}
	cost = max(cost, 1)
	for i := len(s.Log) - 1; i >= 0 && s.Log[i].At >= at; i-- {
		if s.Log[i].At != at || s.Log[i].Slot != slot {
			continue
		}
		if s.Log[i].Cost -= cost; s.Log[i].Cost <= 0 {
			s.Log = append(s.Log[:i], s.Log[i+1:]...)
		}
		return true
	}
	return false
}
