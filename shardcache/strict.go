package shardcache

import (
	"context"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/deadline"
)

// Strict is the Store of strict rules: every decision is made by the
// store, and the checks of one key that arrive while its call is in
// flight go together in the next call. Nothing is leased, and nothing
// decides a check locally; the store's last answer for the key is kept
// (an entry with no lease, dropped after two idle syncs like any), so
// that Cache.Known tells a Fallback what the key had left when the
// store fails: a strict rule fails open from what was known before the
// outage, as a cached one does.
type Strict struct{ c *Cache }

// Strict returns the Store of strict rules, which shares c's store,
// timeout and coalescing.
func (c *Cache) Strict() *Strict { return &Strict{c: c} }

// Take decides cost units of p for key at the store; see Strict. It
// implements policy.Store.
func (s *Strict) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	cost = max(cost, 1)
	if s.c.closed.Load() {
		return algo.Result{}, ErrClosed
	}
	if peek {
		storeDecided.Inc()
		return s.c.b.Take(ctx, key, p, cost, now, true)
	}
	// The deadline's timer is armed only if the check waits for a batch
	// (coalesce.Group.Do selects on Done then); a check that runs its
	// batch itself only passes the deadline on.
	dctx := deadline.New(ctx, time.Now().Add(s.c.o.Timeout))
	res, err := s.c.strict.Do(dctx, key, missReq{p: p, cost: cost, ns: now.UnixNano()})
	dctx.Stop()
	if err != nil {
		return algo.Result{}, fmt.Errorf("shardcache: strict: %w", err)
	}
	return res.r, nil
}

// TakeSlot acquires one slot of the Concurrency limit p for key, named
// slot (non-zero, unique), at the store: coalesced as Take's checks are,
// the acquires of one batch go in one store call (an algo.OpAcquire of
// their ids), each held as its own slot. The Result's At is the slot's
// time, which with slot names it for its release. It implements
// policy.SlotTaker.
func (s *Strict) TakeSlot(ctx context.Context, key []byte, p algo.Params, slot uint64, now time.Time) (algo.Result, error) {
	if s.c.closed.Load() {
		return algo.Result{}, ErrClosed
	}
	if !p.Kind.Info().Slots || slot == 0 {
		return algo.Result{}, fmt.Errorf("shardcache: acquire %q: slot %d of a %s limit: want a non-zero slot of a concurrency limit", key, slot, p.Kind)
	}
	dctx := deadline.New(ctx, time.Now().Add(s.c.o.Timeout))
	res, err := s.c.strict.Do(dctx, key, missReq{p: p, cost: 1, ns: now.UnixNano(), slot: slot})
	dctx.Stop()
	if err != nil {
		return algo.Result{}, fmt.Errorf("shardcache: strict: %w", err)
	}
	return res.r, nil
}

// TakeSlot acquires a slot as the Strict store does: a concurrency
// limit is never leased. It implements policy.SlotTaker.
func (c *Cache) TakeSlot(ctx context.Context, key []byte, p algo.Params, slot uint64, now time.Time) (algo.Result, error) {
	s := Strict{c: c}
	return s.TakeSlot(ctx, key, p, slot, now)
}

// Refund gives back cost units admitted at takenAt, at the store. It
// implements policy.Store.
func (s *Strict) Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	return s.c.b.Refund(ctx, key, p, cost, takenAt, now)
}

// runStrict decides one coalesced batch of strict checks of key in as
// few store calls as its limits allow: each run of checks of one limit,
// all acquires of slots or none, in one call, in arrival order: the
// costs (or slots) admitted are the longest prefix that fits.
func (c *Cache) runStrict(key string, reqs []missReq, out []missResp) error {
	// All the run's calls together last at most the store's timeout: the
	// run holds the key's coalescing flight. (No timer unless a call
	// waits on Done: see package deadline.)
	dctx := deadline.New(context.Background(), time.Now().Add(c.o.Timeout))
	defer dctx.Stop()
	var ctx context.Context = dctx
	for i := 0; i < len(reqs); {
		p, slots := reqs[i].p, reqs[i].slot != 0
		j := i + 1
		for j < len(reqs) && reqs[j].p == p && (reqs[j].slot != 0) == slots {
			j++
		}
		var err error
		if slots {
			err = c.runSlots(ctx, key, reqs[i:j], out[i:j])
		} else {
			err = c.runCosts(ctx, key, reqs[i:j], out[i:j])
		}
		if err != nil {
			return err
		}
		i = j
	}
	return nil
}

// runCosts takes the costs of reqs, all of one limit, in one store call.
func (c *Cache) runCosts(ctx context.Context, key string, reqs []missReq, out []missResp) error {
	p := reqs[0].p
	costs := make([]int64, len(reqs))
	for k := range costs {
		costs[k] = reqs[k].cost
	}
	sent := c.o.Clock().UnixNano()
	admitted, _, r, err := c.b.TakeLease(ctx, []byte(key), p, costs, 0)
	storeCalls.Inc()
	batchSize.Update(float64(len(costs)))
	if err != nil {
		return err
	}
	storeDecided.Add(len(costs))
	c.noteStrict(key, p, r, sent, reqs[len(reqs)-1].ns)
	fillBatch(out, admitted, r)
	return nil
}

// runSlots acquires the slots of reqs, all of one concurrency limit, in
// one store call (an algo.OpAcquire).
func (c *Cache) runSlots(ctx context.Context, key string, reqs []missReq, out []missResp) error {
	ids := make([]uint64, len(reqs))
	for k := range ids {
		ids[k] = reqs[k].slot
	}
	ops := []algo.Op{{Kind: algo.OpAcquire, Key: []byte(key), Params: reqs[0].p, Slots: ids}}
	err := c.b.Sync(ctx, ops)
	storeCalls.Inc()
	batchSize.Update(float64(len(ids)))
	if err == nil {
		err = ops[0].Err
	}
	if err != nil {
		return err
	}
	storeDecided.Add(len(ids))
	fillBatch(out, ops[0].Admitted, ops[0].Result)
	return nil
}

// fillBatch sets the answers of a batch whose first admitted were
// admitted, with the batch's Result r.
func fillBatch(out []missResp, admitted int, r algo.Result) {
	for k := range out {
		if k < admitted {
			out[k].r = algo.Result{Allowed: true, Limit: r.Limit, Remaining: r.Remaining, Reset: r.Reset, At: r.At}
		} else {
			out[k].r = r
		}
	}
}

// noteStrict keeps r, the store's answer at the call sent at sent to a
// batch of strict checks of key whose last came at ns, as the view of
// key's entry (see Strict): what Known tells a Fallback. One shard lock,
// and for a key new to the cache an entry.
func (c *Cache) noteStrict(key string, p algo.Params, r algo.Result, sent, ns int64) {
	sh := c.shard([]byte(key))
	sh.mu.Lock()
	e := c.entry(sh, key, p)
	c.learn(e, r, sent)
	c.touch(sh, e, ns, false) // kept while checked, dropped when idle
	sh.mu.Unlock()
}
