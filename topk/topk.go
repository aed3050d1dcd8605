// Package topk finds the most frequent keys of a stream in bounded memory:
// the Space-Saving algorithm (Metwally, Agrawal, El Abbadi, 2005) over a
// fixed number of counters.
//
// With k counters and N keys added in all, every key added more than N/k
// times is held, and each held key's Count overestimates its true count by
// at most its Error, itself at most N/k: Count−Error ≤ true ≤ Count.
package topk

import (
	"cmp"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// Entry is one held key.
type Entry struct {
	// Key is the key as it was added.
	Key string `json:"key"`
	// Count is an upper bound of how often Key was added.
	Count uint64 `json:"count"`
	// Error bounds the overestimate: Key was added at least Count−Error
	// times.
	Error uint64 `json:"error"`
}

// Sketch holds the most frequent keys added to it, in at most k counters.
// It is safe for concurrent use; Add takes one mutex and, once the keys
// it holds have been seen at their longest, does not allocate.
type Sketch struct {
	mu    sync.Mutex       // guards the fields below
	k     int              // the most counters
	total uint64           // keys added, in all
	slots []slot           // at most k
	index map[uint64]int32 // xxhash of a key → its slot
}

type slot struct {
	key   []byte // reused when the slot changes key
	hash  uint64
	count uint64
	err   uint64
}

// New returns a Sketch of k counters (k < 1 means 1).
func New(k int) *Sketch {
	k = max(k, 1)
	return &Sketch{k: k, slots: make([]slot, 0, k), index: make(map[uint64]int32, k)}
}

// Add counts one occurrence of key. The key bytes are copied.
func (s *Sketch) Add(key []byte) {
	h := xxhash.Sum64(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total++
	if i, ok := s.index[h]; ok {
		sl := &s.slots[i]
		// A 64-bit hash collision merges two keys into one counter; it
		// keeps the newer key's name. Vanishingly rare, and the bounds
		// still hold for the merged count.
		if string(sl.key) != string(key) {
			sl.key = append(sl.key[:0], key...)
		}
		sl.count++
		return
	}
	if len(s.slots) < s.k {
		s.slots = append(s.slots, slot{key: append([]byte(nil), key...), hash: h, count: 1})
		s.index[h] = int32(len(s.slots) - 1)
		return
	}
	// Replace the least counted key: the new key inherits its count as
	// its possible overestimate.
	m := 0
	for i := 1; i < len(s.slots); i++ {
		if s.slots[i].count < s.slots[m].count {
			m = i
		}
	}
	sl := &s.slots[m]
	delete(s.index, sl.hash)
	sl.key = append(sl.key[:0], key...)
	sl.hash = h
	sl.err = sl.count
	sl.count++
	s.index[h] = int32(m)
}

// Top returns up to n held keys, the most counted first (n ≤ 0: all), and
// the number of keys added in all.
func (s *Sketch) Top(n int) ([]Entry, uint64) {
	s.mu.Lock()
	out := make([]Entry, len(s.slots))
	for i := range s.slots {
		sl := &s.slots[i]
		out[i] = Entry{Key: string(sl.key), Count: sl.count, Error: sl.err}
	}
	total := s.total
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out, total
}

// Len returns the number of keys held: at most k.
func (s *Sketch) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.slots)
}
