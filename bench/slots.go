package main

import "sync"

// slots hands out the request ids of one connection, 0 … depth-1. An id
// is in flight at most once, so an answer's id names its request however
// the answers are ordered, and the number of ids bounds the requests in
// flight. It is safe for concurrent use: the sender takes ids, the
// receiver gives them back.
type slots struct {
	mu    sync.Mutex
	free  []uint32 // guarded by mu
	depth int
	// wake holds a token when ids were given back since the sender last
	// looked; the sender waits on it when none is free.
	wake chan struct{}
}

func newSlots(depth int) *slots {
	s := &slots{free: make([]uint32, depth), depth: depth, wake: make(chan struct{}, 1)}
	for i := range s.free {
		s.free[i] = uint32(depth - 1 - i) // 0 first
	}
	return s
}

// get takes a free id, and reports false when every id is in flight.
func (s *slots) get() (uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.free)
	if n == 0 {
		return 0, false
	}
	id := s.free[n-1]
	s.free = s.free[:n-1]
	return id, true
}

// put gives back ids and wakes the sender.
func (s *slots) put(ids []uint32) {
	s.mu.Lock()
	s.free = append(s.free, ids...)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// idle reports whether no id is in flight.
func (s *slots) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.free) == s.depth
}
