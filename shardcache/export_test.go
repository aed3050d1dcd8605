package shardcache

// SendChunk, SendCalls and WarmLifeIntervals are sendChunk, sendCalls
// and warmLifeIntervals, for the tests.
const (
	SendChunk         = sendChunk
	SendCalls         = sendCalls
	WarmLifeIntervals = warmLifeIntervals
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
