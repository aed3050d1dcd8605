package shardcache

import (
	"context"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
)

// PeekForDenial decides, without taking it, cost units of p for key, for
// a check that another rule denies with retry-after retryAfter and that
// only looks for a longer denial. The answer is the key's lease, its
// denial in force, or what the store last said of it when that is recent
// enough (see the package doc); else one store call, coalesced with the
// key's other peeks, whose answer the key then keeps for retryAfter (at least a sync interval): the check
// that asked will not come back before. It implements
// policy.DenialPeeker.
func (c *Cache) PeekForDenial(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, retryAfter time.Duration) (algo.Result, error) {
	return c.peek(ctx, key, p, max(cost, 1), now, max(retryAfter, c.o.SyncInterval))
}

// peek answers a peek of cost from the cache when it can, else by a
// coalesced store call whose answer the key keeps: for keep when keep > 0
// (a denial's peek), and as any store answer otherwise.
func (c *Cache) peek(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, keep time.Duration) (algo.Result, error) {
	ns := now.UnixNano()
	sh := c.shard(key)
	sh.mu.Lock()
	if e := sh.m[string(key)]; e != nil && e.p == p {
		c.touch(sh, e, ns, false)
		if r, ok := c.peekLocal(e, ns, cost, keep > 0); ok {
			sh.mu.Unlock()
			countLocal(r)
			return r, nil
		}
	}
	sh.mu.Unlock()
	if c.closed.Load() {
		return algo.Result{}, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	res, err := c.peeks.Do(ctx, key, missReq{p: p, cost: cost, ns: ns, keep: int64(keep)})
	cancel()
	if err != nil {
		return algo.Result{}, fmt.Errorf("shardcache: peek: %w", err)
	}
	return res.r, nil
}

// peekLocal answers a peek from e when it can: from its lease or a
// denial in force, as a take would be, or from the store's last answer
// while that is fresh, that is younger than a sync interval or, for a
// denial's peek, kept until e.peekUntil. An answer that would deny goes
// to the store, which alone knows the retry-after. The caller holds e's
// shard lock.
func (c *Cache) peekLocal(e *entry, ns, cost int64, forDenial bool) (algo.Result, bool) {
	if r, ok := c.local(e, ns, cost, true); ok {
		return r, true
	}
	fresh := e.answerAt != 0 && ns-e.answerAt < int64(c.o.SyncInterval)
	if !fresh && !(forDenial && ns < e.peekUntil) {
		return algo.Result{}, false
	}
	capacity := e.p.Capacity()
	rem := c.remaining(e, ns) + e.lease
	if rem < cost {
		return algo.Result{}, false
	}
	// As the store answers a peek: what would remain after cost.
	return algo.Result{Allowed: true, Limit: capacity, Remaining: min(rem-cost, capacity), Reset: untilNs(e.resetAt, ns)}, true
}

// runPeek decides one coalesced batch of peeks of key: each from what
// the cache knows once the batch's first store call has answered, the
// others by a store call each. The key's entry keeps every answer, like
// a take's: a denial is remembered as a take's is, and an allowed answer
// of a denial's peek is kept for the denial's retry-after.
func (c *Cache) runPeek(key string, reqs []missReq, out []missResp) error {
	c.running.Add(1)
	defer c.running.Add(-1)
	if c.closed.Load() {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	sh := c.shard([]byte(key))
	for k := range reqs {
		q := &reqs[k]
		sh.mu.Lock()
		e := c.entry(sh, key, q.p)
		if r, ok := c.peekLocal(e, q.ns, q.cost, q.keep > 0); ok {
			sh.mu.Unlock()
			out[k].r = r
			countLocal(r)
			continue
		}
		sh.mu.Unlock()
		sent := c.o.Clock().UnixNano()
		r, err := c.b.Take(ctx, []byte(key), q.p, q.cost, time.Unix(0, q.ns), true)
		storeCalls.Inc()
		storeDecided.Inc()
		if err != nil {
			return err
		}
		sh.mu.Lock()
		e = c.entry(sh, key, q.p)
		c.learn(e, r, sent)
		if r.Allowed {
			e.remaining += q.cost // a peek's Remaining is after its cost
		}
		switch {
		case r.Allowed && q.keep > 0:
			e.peekUntil = max(e.peekUntil, sent+q.keep)
		case !r.Allowed && sent <= e.staleBefore:
			// Sent before the key changed (a refund, a reset): the
			// peek's answer, not kept as a denial.
		case !r.Allowed && r.RetryAfter != algo.Never:
			e.denials++
			r.RetryAfter = c.denialFor(e, r.RetryAfter)
			e.deniedUntil = sent + int64(r.RetryAfter)
			e.deniedCost = q.cost
			if e.lease == 0 {
				e.gone = missDenied
			}
		}
		sh.mu.Unlock()
		out[k].r = r
	}
	return nil
}
