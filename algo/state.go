package algo

import "time"

// State is one key's stored state; its meaning depends on the Kind. The
// zero State is a fresh key, one that has admitted nothing.
//
//	Kind            A                      B                      C
//	TokenBucket     level (token×µs units)  last update, µs (0 = fresh)
//	GCRA            theoretical arrival µs
//	FixedWindow     window start, µs        count in that window
//	SlidingCounter  window start, µs        count in that window   count in the window before
//	SlidingLog      (unused: see Log)
//	Concurrency     (unused: see Log; each Entry is an admission in flight)
//
// A State is a plain value: callers serialise access to it.
type State struct {
	A, B, C int64
	// Log holds a SlidingLog's or a Concurrency limit's admissions,
	// in (At, Slot) order. Admissions at the same microsecond share one
	// Entry, but for a Concurrency limit's acquired slots (see Acquire).
	Log []Entry
	// Out is the units each holder has out on lease of the key, kept by
	// the ops that carry a Holder (see Op); a store without leases never
	// has any. It is not part of the algorithm's state: Decide and Idle
	// do not read it.
	Out []Out
}

// Entry is one admission of a SlidingLog or a Concurrency limit: Cost
// units at At (unix µs).
type Entry struct {
	At, Cost int64
	// Slot is the id of a Concurrency limit's acquired slot (Acquire),
	// which names it for its release; 0 for the other admissions.
	Slot uint64
}

// micros converts a count of microseconds to a Duration.
func micros(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// ceilDiv returns ⌈a/b⌉ for a ≥ 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if q*b != a {
		q++
	}
	return q
}
