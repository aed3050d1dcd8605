package redisx

// UseCallerClock makes s pass the caller's now to the scripts instead of
// letting them read Redis TIME, so that tests can drive the clock.
func (s *Store) UseCallerClock() { s.callerClock = true }

// DirectCalls returns how many single calls went over the direct
// connection.
func (c *Client) DirectCalls() uint64 { return c.directCalls.Load() }
