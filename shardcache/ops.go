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
// denial were the old state's. With Options.Holder and Options.Recall,
// a reset is announced to the other daemons first, which return their
// leases of the key and report what they admitted from them; after
// RecallWait the reset leaves a fresh key less the units still out on
// lease (algo.OpReset), this daemon's lease goes back into it in the
// same call, and the reset is announced again, so that the others drop
// their view of the key. Without a Holder, a reset's lease is dropped
// and a grant's goes back at the next sync. Do fills each op's Result
// and Err as Backend.Sync does (which bounds its own time when ctx has
// no deadline); now is not read (the store's clock decides). It
// implements policy.Operator.
//
// The ops of a lease's settle or release (algo.OpCharge, algo.OpRefund,
// algo.OpRelease, and algo.OpPeek, which records a settle at the
// estimate) go to the store as they are, within the Timeout: what
// the cache holds of the key (its lease, already counted at the store)
// stays. A refund drops the key's denial and view here (see
// Corrected), and, when it may make room for checks that were refused
// (see mayUnblock), is announced to the other daemons
// (Options.Refunded), which drop theirs: its units are usable on every
// daemon once the announcement is in.
func (c *Cache) Do(ctx context.Context, ops []algo.Op, _ time.Time) error {
	return c.do(ctx, ops, true)
}

// do is Do; announce false keeps the refunds among ops unannounced
// (a strict rule's: no daemon holds a denial of its keys).
func (c *Cache) do(ctx context.Context, ops []algo.Op, announce bool) error {
	if c.closed.Load() {
		return ErrClosed
	}
	if direct(ops) {
		tctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
		defer cancel()
		if err := c.b.Sync(tctx, ops); err != nil {
			return fmt.Errorf("shardcache: %w", err)
		}
		c.refunded(ctx, ops, announce)
		return nil
	}
	resets := false
	for i := range ops {
		in := ops[i].Kind.Info()
		if !in.Operator {
			return fmt.Errorf("shardcache: do: %s is not an operator's op", ops[i].Kind)
		}
		resets = resets || in.Clears
	}
	recall := c.o.Recall != nil && c.o.Holder != "" && resets
	if recall {
		// First the other daemons return their leases of the keys and
		// report what they admitted from them, so that the reset leaves
		// out only the units still out; what is not reported within
		// RecallWait stays out (the fresh key then admits that much less,
		// never more).
		c.recallResets(ctx, ops)
		t := time.NewTimer(c.o.RecallWait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	// This daemon's leases go back in the same call, each after its
	// key's op: into the fresh state, whose reset left them out.
	all := ops
	for i := range ops {
		if ret, ok := c.forget(&ops[i]); ok {
			if len(all) == len(ops) {
				all = append(ops[:len(ops):len(ops)], ret)
			} else {
				all = append(all, ret)
			}
		}
	}
	err := c.b.Sync(ctx, all)
	copy(ops, all) // the outcomes, when all is a copy
	for _, ret := range all[len(ops):] {
		if err == nil && ret.Err == nil {
			leasesReturn.Add(int(ret.N))
		} else {
			leasesLost.Add(int(ret.N))
		}
	}
	if err != nil {
		return fmt.Errorf("shardcache: %w", err)
	}
	if recall {
		// Then they drop their view of the keys, which the reset made
		// stale: best effort, as a daemon that misses it answers from
		// its view for at most one sync interval (or a hammered key's
		// denial), and never admits more than the bound.
		c.recallResets(ctx, ops)
	}
	return nil
}

// refunded handles the refunds among ops, which the store applied: each
// key's denial and view are dropped here, and announced to the other
// daemons when the refund may make room for refused checks. An
// announcement that fails costs a daemon that missed it at most its
// denial of the key: a sync interval, or a hammered key's retry-after.
func (c *Cache) refunded(ctx context.Context, ops []algo.Op, announce bool) {
	for i := range ops {
		op := &ops[i]
		if op.Kind != algo.OpRefund || op.Err != nil {
			continue
		}
		c.dropView(op.Key, op.Params.Kind)
		if announce && c.o.Refunded != nil && mayUnblock(op) {
			refundsSent.Inc()
			_ = c.o.Refunded(ctx, op.Key, op.Params.Kind)
		}
	}
}

// mayUnblock reports whether op, a refund the store applied, may make
// room for checks that were refused before it: its key had less than
// half its capacity left before it. A key with more refuses only checks
// of more than half its capacity; announcing every settle's refund of
// such keys would cost the store a call per settle for nothing.
func mayUnblock(op *algo.Op) bool {
	// The Result is a peek of cost 1 after the refund.
	before := op.Result.Remaining + 1 - op.N
	return 2*before < op.Params.Capacity()
}

// recallResets announces the keys of ops's resets with Options.Recall.
func (c *Cache) recallResets(ctx context.Context, ops []algo.Op) {
	for i := range ops {
		if ops[i].Kind.Info().Clears && ops[i].Err == nil {
			_ = c.o.Recall(ctx, ops[i].Key, ops[i].Params.Kind)
		}
	}
}

// forget drops the entry of op's key, op being an operator's op. With
// a Holder, op carries the accounting and reports what the entry
// admitted from its lease, and forget returns the return of the entry's
// lease (to be sent after op; ok false when there is none). Without, a
// reset's lease is counted as lost (returned into the fresh state, it
// would be counted twice) and a grant's goes back at the next sync.
func (c *Cache) forget(op *algo.Op) (ret algo.Op, ok bool) {
	key := op.Key
	if c.o.Holder != "" {
		op.Holder, op.LeaseLife = c.o.Holder, c.leaseLife()
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[string(key)]
	if e == nil {
		return algo.Op{}, false
	}
	switch {
	case c.o.Holder != "" && e.p == op.Params:
		op.Spent, op.SpentAt = c.takeSpent(e), e.leaseAt
		if e.lease > 0 {
			ret = c.heldOp(algo.OpRefund, e, e.lease)
			ret.Key, ret.TakenAt, ok = key, e.leaseAt, true
			e.lease = 0
		}
	case op.Kind.Info().Clears && c.o.Holder == "":
		leasesLost.Add(int(e.lease))
		e.lease = 0
	default:
		c.orphan(string(key), e)
	}
	e.due = dead
	delete(sh.m, string(key))
	c.entries.Add(-1)
	liveEntries.Add(-1)
	return ret, ok
}

// direct reports whether every op is one of a lease's, which Do sends to
// the store as it is.
func direct(ops []algo.Op) bool {
	for i := range ops {
		if !ops[i].Kind.Info().Settle {
			return false
		}
	}
	return len(ops) > 0
}

// Do runs an operator's ops, and a lease's, as Cache.Do does, but
// announces no refund: a strict rule's checks all go to the store, and
// no daemon holds a denial of its keys. It implements policy.Operator.
func (s *Strict) Do(ctx context.Context, ops []algo.Op, _ time.Time) error {
	return s.c.do(ctx, ops, false)
}
