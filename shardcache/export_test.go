package shardcache

// SendChunk, SendCalls, WarmIntervals, WarmLifeIntervals and WarmFloor
// are sendChunk, sendCalls, warmIntervals, warmLifeIntervals and
// warmFloor, for the tests.
const (
	SendChunk         = sendChunk
	SendCalls         = sendCalls
	WarmIntervals     = warmIntervals
	WarmLifeIntervals = warmLifeIntervals
	WarmFloor         = warmFloor
)

// Held returns the units key's entry holds on lease and has admitted
// from its lease without reporting them, and whether there is an entry.
func (c *Cache) Held(key []byte) (lease, spent int64, ok bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[string(key)]
	if e == nil {
		return 0, 0, false
	}
	return e.lease, e.spent, true
}

// Misses returns rld_cache_misses_total{reason}, counted by every Cache.
func Misses(reason string) uint64 {
	for r, name := range missNames {
		if name == reason {
			return misses[r].Get()
		}
	}
	panic("BUG: no miss reason " + reason)
}

// Visits returns how many entries c's sync loop has visited.
func (c *Cache) Visits() int64 {
	c.sync.mu.Lock()
	defer c.sync.mu.Unlock()
	return c.sync.visits
}

// Rate returns the smoothed units per sync interval of key's entry, as
// of the sync loop's last visit of it (0 without an entry).
func (c *Cache) Rate(key []byte) int64 {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[string(key)]; e != nil {
		return e.rate
	}
	return 0
}
