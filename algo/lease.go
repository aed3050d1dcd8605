package algo

import "time"

// Out is the units one holder (a daemon of a fleet) has out on lease of
// a key: leased, and neither admitted by the holder (as far as it has
// reported) nor given back. They count until Until (unix µs of the
// store's clock): a holder that crashed stops holding them then.
type Out struct {
	Holder string
	Units  int64
	Until  int64
}

// outsLive drops the entries of s.Out that have lapsed at now (Until not
// after it) or hold nothing, and returns the units of the others.
func outsLive(s *State, now int64) (total int64) {
	live := s.Out[:0]
	for _, o := range s.Out {
		if o.Units > 0 && o.Until > now {
			live = append(live, o)
			total += o.Units
		}
	}
	clear(s.Out[len(live):])
	s.Out = live
	return total
}

// outIndex returns the index of holder's entry in s.Out, or -1.
func outIndex(s *State, holder string) int {
	for i := range s.Out {
		if s.Out[i].Holder == holder {
			return i
		}
	}
	return -1
}

// outAdd adds n units (which may be negative) to holder's entry, not
// below 0, creating it (n > 0) with Until until or moving its Until to
// until when that is later; an entry left with nothing goes.
func outAdd(s *State, holder string, n, until int64) {
	i := outIndex(s, holder)
	if i < 0 {
		if n > 0 {
			s.Out = append(s.Out, Out{Holder: holder, Units: n, Until: until})
		}
		return
	}
	o := &s.Out[i]
	o.Units = max(o.Units+n, 0)
	o.Until = max(o.Until, until)
	if o.Units == 0 {
		s.Out = append(s.Out[:i], s.Out[i+1:]...)
	}
}

// outOwn returns the units holder has out.
func outOwn(s *State, holder string) int64 {
	if i := outIndex(s, holder); i >= 0 {
		return s.Out[i].Units
	}
	return 0
}

// LeaseUntil returns until when units of limit p leased at now with the
// lease lifetime life count as out: life after now, and no later than
// their window counts: for FixedWindow the end of now's window, with
// which the lease lapses; for SlidingCounter the end of the next one,
// whose estimate still weighs them (returned then, they are refunded to
// the previous window's count).
func LeaseUntil(p Params, now int64, life time.Duration) int64 {
	until := now + life.Microseconds()
	per := p.PeriodMicros()
	switch p.Kind {
	case FixedWindow:
		until = min(until, now-now%per+per)
	case SlidingCounter:
		until = min(until, now-now%per+2*per)
	}
	return until
}

// LeaseCounts reports whether units of limit p leased at (unix µs) still
// count as out at now: those of a fixed window only in their window,
// those of a sliding counter in their window and the next one (its
// estimate weighs them), those of a bucket always. A return or a
// reported spend of units that no longer count leaves the holder's units
// out alone: those belong to later leases.
func LeaseCounts(p Params, now, at int64) bool {
	per := p.PeriodMicros()
	switch p.Kind {
	case FixedWindow:
		return at-at%per == now-now%per
	case SlidingCounter:
		return at-at%per >= now-now%per-per
	}
	return true
}

// applyHeld runs the lease accounting of op on s before the op itself:
// the entries that lapsed go, and the holder's entry loses the units it
// reports spent. It returns the units out in all, after that.
func applyHeld(op *Op, s *State, now int64) int64 {
	total := outsLive(s, now)
	if op.Holder != "" && op.Spent != 0 && outIndex(s, op.Holder) >= 0 && LeaseCounts(op.Params, now, op.SpentAt) {
		before := outOwn(s, op.Holder)
		outAdd(s, op.Holder, -op.Spent, 0)
		total += outOwn(s, op.Holder) - before
	}
	return total
}
