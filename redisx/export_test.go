package redisx

// UseCallerClock makes s pass the caller's now to the scripts instead of
// letting them read Redis TIME, so that tests can drive the clock.
func (s *Store) UseCallerClock() { s.callerClock = true }
