package shardcache

import (
	"context"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
)

// Do runs an operator's ops (algo.OpReset, algo.OpGrant) at the store,
// after dropping what the cache holds of each op's key, so that the
// daemon's next check of the key asks the store: the cache's answer and
// denial were the old state's. Of the lease the entry held, a reset
// gives nothing back (those units belong to the state the reset
// cleared: returned, they would be counted against the fresh one) and a
// grant gives it back at the next sync. Do fills each op's Result and
// Err as Backend.Sync does (which bounds its own time when ctx has no
// deadline); now is not read (the store's clock decides). It implements
// policy.Operator.
//
// The ops of a lease's settle or release (algo.OpCharge, algo.OpRefund,
// algo.OpRelease, and algo.OpPeek, which records a settle at the
// estimate) go to the store as they are, within the Timeout: what
// the cache holds of the key (its lease, already counted at the store)
// stays; a refund shows in the key's checks once its lease runs out.
func (c *Cache) Do(ctx context.Context, ops []algo.Op, _ time.Time) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if direct(ops) {
		ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
		defer cancel()
		if err := c.b.Sync(ctx, ops); err != nil {
			return fmt.Errorf("shardcache: %w", err)
		}
		return nil
	}
	for i := range ops {
		if k := ops[i].Kind; k != algo.OpReset && k != algo.OpGrant {
			return fmt.Errorf("shardcache: do: %s is not an operator's op", k)
		}
	}
	for i := range ops {
		c.forget(ops[i].Key, ops[i].Kind == algo.OpReset)
	}
	if err := c.b.Sync(ctx, ops); err != nil {
		return fmt.Errorf("shardcache: %w", err)
	}
	return nil
}

// forget drops the entry of key; its lease goes back at the next sync,
// unless discard is set, when it is counted as lost.
func (c *Cache) forget(key []byte, discard bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[string(key)]
	if e == nil {
		return
	}
	if discard {
		leasesLost.Add(int(e.lease))
		e.lease = 0
	} else {
		c.orphan(string(key), e)
	}
	delete(sh.m, string(key))
	c.entries.Add(-1)
	liveEntries.Add(-1)
}

// direct reports whether every op is one of a lease's, which Do sends to
// the store as it is.
func direct(ops []algo.Op) bool {
	for i := range ops {
		switch ops[i].Kind {
		case algo.OpCharge, algo.OpRefund, algo.OpRelease, algo.OpPeek:
		default:
			return false
		}
	}
	return len(ops) > 0
}

// Do runs an operator's ops, and a lease's, as Cache.Do does. It
// implements policy.Operator.
func (s *Strict) Do(ctx context.Context, ops []algo.Op, now time.Time) error {
	return s.c.Do(ctx, ops, now)
}
