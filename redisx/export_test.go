package redisx

import "github.com/rld/rld/redisx/keyslot"

// UseCallerClock makes s pass the caller's now to the scripts instead of
// letting them read Redis TIME, so that tests can drive the clock.
func (s *Store) UseCallerClock() { s.callerClock = true }

// DirectCalls returns how many single calls went over the direct
// connection.
func (c *Client) DirectCalls() uint64 { return c.directCalls.Load() }

// Redirects returns how many calls, or ops of a batch, a node redirected
// (MOVED, ASK) while the slot map named it.
func (c *Client) Redirects() uint64 { return c.redirects.Load() }

// SlotNode returns the address of the primary the slot map names for the
// Redis key rkey, "" when it names none.
func (c *Client) SlotNode(rkey string) string { return c.g.slots.node(keyslot.Of(rkey)) }
