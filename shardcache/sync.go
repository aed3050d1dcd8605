package shardcache

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/rld/rld/algo"
)

// Run runs the sync loop until ctx ends: Sync every Options.SyncInterval
// and, halfway between, ReturnIdle, so that a lease whose key went idle
// is back at the store within one interval.
func (c *Cache) Run(ctx context.Context) {
	t := time.NewTicker(c.o.SyncInterval / 2)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if tick%2 == 0 {
				c.ReturnIdle(now)
			} else {
				c.Sync(now)
			}
		}
	}
}

// syncRef ties an op of a sync to the entry it was built from.
type syncRef struct {
	sh         *shard
	key        string
	e          *entry // nil for an orphan's return
	start, end int    // the op's Key in syncBuf.keys
}

// syncBuf holds what Sync and ReturnIdle build, reused from one to the
// next, so that a sync allocates nothing once warm. Its mutex serialises
// them (Run calls them in turn; a test may call them itself).
type syncBuf struct {
	mu   sync.Mutex
	ops  []algo.Op
	refs []syncRef
	keys []byte // the ops' keys, back to back
}

// add appends op, the op of entry e of key in sh (nil for an orphan's),
// to b.
func (b *syncBuf) add(op algo.Op, sh *shard, key string, e *entry) {
	ref := syncRef{sh: sh, key: key, e: e}
	if sh != nil {
		ref.start = len(b.keys)
		b.keys = append(b.keys, key...)
		ref.end = len(b.keys)
	}
	b.ops = append(b.ops, op)
	b.refs = append(b.refs, ref)
}

// reset empties b for the next sync.
func (b *syncBuf) reset() {
	clear(b.ops) // drops the keys and errors they point to
	b.ops, b.refs, b.keys = b.ops[:0], b.refs[:0], b.keys[:0]
}

// seal points each op of an entry at its key, once b.keys has stopped
// growing.
func (b *syncBuf) seal() {
	for i := range b.refs {
		if r := &b.refs[i]; r.sh != nil {
			b.ops[i].Key = b.keys[r.start:r.end:r.end]
		}
	}
}

// Sync runs one sync at now: it returns the leases of keys that saw no
// traffic since the last sync and the leases that lapsed, renews the
// leases of keys still hot, refreshes the remaining quota of the other
// hot keys, and drops entries idle for two syncs, in one Backend.Sync. It
// reports how many ops it sent. Run calls it every interval.
func (c *Cache) Sync(now time.Time) int {
	if c.closed.Load() {
		return 0
	}
	start := time.Now() // for the duration metric only
	ns := now.UnixNano()
	peers := c.peers()
	b := &c.sync
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.reset()
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for key, e := range sh.m {
			if op, ok := c.plan(e, ns, peers); ok {
				b.add(op, sh, key, e)
			}
			if e.idleSyncs >= 2 && e.lease == 0 && ns >= e.deniedUntil {
				if e.spent != 0 && c.o.Holder != "" {
					b.add(c.reportOp(e), sh, key, e)
				}
				delete(sh.m, key)
				c.entries.Add(-1)
				liveEntries.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
	c.orphanMu.Lock()
	for _, op := range c.orphans {
		b.add(op, nil, "", nil)
	}
	clear(c.orphans)
	c.orphans = c.orphans[:0]
	c.orphanMu.Unlock()
	if len(b.ops) == 0 {
		return 0
	}
	b.seal()
	c.send(b.ops, b.refs)
	syncs.Inc()
	syncDuration.UpdateDuration(start)
	return len(b.ops)
}

// send runs ops in one Backend.Sync and applies each outcome to the entry
// of its ref.
func (c *Cache) send(ops []algo.Op, refs []syncRef) {
	sent := c.o.Clock().UnixNano()
	if err := c.b.Sync(context.Background(), ops); err != nil {
		for i := range ops {
			ops[i].Err = err
		}
	}
	for i := range ops {
		c.apply(&ops[i], refs[i], sent)
	}
	syncOps.Add(len(ops))
}

// plan updates e's rates for the interval that ended at ns and returns
// the op e needs, if any. The caller holds e's shard lock.
func (c *Cache) plan(e *entry, ns, peers int64) (algo.Op, bool) {
	e.rate = (e.rate + e.used + 1) / 2
	e.denyRate = (e.denyRate + e.denials + 1) / 2
	if e.seen {
		e.idleSyncs = 0
	} else {
		e.idleSyncs++
	}
	hot := e.used > 0
	e.used, e.denials, e.seen = 0, 0, false

	if e.warm && e.lease > 0 {
		return c.planWarm(e, ns, peers)
	}
	switch {
	case e.lease > 0 && (!hot || c.returnable(e, ns)):
		// Nobody used it, or it lapsed: give it back.
		op := c.heldOp(algo.OpRefund, e, e.lease)
		op.TakenAt = e.leaseAt
		e.lease = 0
		return op, true
	case !hot || ns < e.deniedUntil:
		// Idle, or denied until a time the store gave: nothing to renew
		// or refresh.
		return algo.Op{}, false
	case e.lease > 2*e.rate:
		op := c.heldOp(algo.OpRefund, e, e.lease-e.rate)
		op.TakenAt = e.leaseAt
		e.lease = e.rate
		return op, true
	case e.rate < minSyncRate:
		// Warm, not hot: its next miss leases what it needs. Renewing
		// or refreshing every such key of a long-tailed mix would cost
		// Redis a call per key per interval.
		return algo.Op{}, false
	}
	if want := min(e.rate-e.lease, c.remaining(e, ns)/(2*peers)); want > 0 && ns >= e.noLeaseUntil {
		return c.heldOp(algo.OpLease, e, want), true
	}
	return c.heldOp(algo.OpPeek, e, 1), true
}

// planWarm returns the op a warm lease needs at the sync at ns, if any:
// none while it holds more than two intervals of the key's traffic and
// its lifetime is more than three intervals away, whether or not the
// key saw checks, nor while it was not used since its last op and its
// lifetime is that far. Else, while the key is far from its limit: a
// renewal (the spend reported, the lease topped up to warmIntervals of
// traffic and its lifetime extended, in one op) when the key used it
// since its last op; when not, the lease lapses with no call (a
// bucket's units, lost, come back with its refill; the store stops
// counting them out when the lifetime it was told ends). Otherwise its
// return. The caller holds e's shard lock.
func (c *Cache) planWarm(e *entry, ns, peers int64) (algo.Op, bool) {
	interval := int64(c.o.SyncInterval)
	ending := e.leaseUntil-ns <= 3*interval
	if !ending && (e.lease > 2*e.rate || e.spent <= 0) {
		return algo.Op{}, false
	}
	if limit := c.remaining(e, ns); ns < e.leaseUntil && ns >= e.noLeaseUntil && c.far(e, limit) {
		if e.spent <= 0 {
			leasesLost.Add(int(e.lease))
			e.lease, e.spent = 0, 0
			return algo.Op{}, false
		}
		want := min(max(warmIntervals*e.rate, warmFloor), limit/(2*peers)) - e.lease
		if ending {
			want = max(want, 1) // a grant extends the lifetime
		}
		if want > 0 {
			op := c.heldOp(algo.OpLease, e, want)
			op.LeaseLife = c.warmLife()
			return op, true
		}
	}
	op := c.heldOp(algo.OpRefund, e, e.lease)
	op.TakenAt = e.leaseAt
	e.lease = 0
	return op, true
}

// minSyncRate is the fewest units per sync interval a key must use for
// the sync to renew its lease or refresh its view.
const minSyncRate = 4

// apply records the outcome of one sync op sent at local time sent.
func (c *Cache) apply(op *algo.Op, ref syncRef, sent int64) {
	if op.Err != nil {
		syncErrors.Inc()
		if op.Kind == algo.OpRefund {
			// The units may or may not be back: counted as lost, never
			// as admitted.
			leasesLost.Add(int(op.N))
		}
		return
	}
	if op.Kind == algo.OpRefund {
		leasesReturn.Add(int(op.N))
	}
	if op.Kind == algo.OpLease {
		leasesGranted.Add(int(op.Granted))
	}
	if ref.sh == nil {
		return
	}
	ref.sh.mu.Lock()
	defer ref.sh.mu.Unlock()
	e := ref.sh.m[ref.key]
	if e != ref.e || e.p != op.Params {
		// Evicted or replaced meanwhile: a lease goes back next time.
		if op.Kind == algo.OpLease && op.Granted > 0 {
			c.orphanMu.Lock()
			c.orphans = append(c.orphans, algo.Op{Kind: algo.OpRefund, Key: bytes.Clone(op.Key), Params: op.Params, N: op.Granted, TakenAt: op.Result.At})
			c.orphanMu.Unlock()
		}
		return
	}
	if op.Kind == algo.OpLease {
		c.applyLease(ref.key, e, op.Granted, op.Result, sent, op.LeaseLife == c.warmLife())
	}
	c.learn(e, op.Result, sent)
}

// returnable reports whether e's lease should go back now: the key saw
// no check for half a sync interval, the lease lapsed, or it will lapse
// with its window before the next tick (returned while its window is
// current, the units count again; lapsed, they are lost to the window).
func (c *Cache) returnable(e *entry, ns int64) bool {
	if e.warm {
		return ns >= e.leaseUntil // kept while idle: see planWarm
	}
	return c.idle(e, ns) || ns >= e.leaseUntil ||
		(windowed(e.p.Kind) && e.leaseUntil-ns < int64(c.o.SyncInterval)/2)
}

// idle reports whether e saw no check in the last half sync interval.
func (c *Cache) idle(e *entry, ns int64) bool {
	return e.lastUse < ns-int64(c.o.SyncInterval)/2
}

// ReturnIdle returns, in one Backend.Sync, the leases of the keys that saw
// no check in the last half sync interval. Run calls it between syncs.
func (c *Cache) ReturnIdle(now time.Time) int {
	if c.closed.Load() {
		return 0
	}
	ns := now.UnixNano()
	b := &c.sync
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.reset()
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for key, e := range sh.m {
			if e.lease > 0 && c.returnable(e, ns) {
				op := c.heldOp(algo.OpRefund, e, e.lease)
				op.TakenAt = e.leaseAt
				b.add(op, sh, key, e)
				e.lease = 0
			}
		}
		sh.mu.Unlock()
	}
	if len(b.ops) > 0 {
		b.seal()
		c.send(b.ops, b.refs)
	}
	return len(b.ops)
}

// Recalled handles another daemon's recall of key under algorithm kind
// at now (Options.Recall): the entry drops what it knows of the store's
// state (its denial, its view of the remaining quota: a reset may have
// made them wrong), leases nothing more for a sync interval, and gives
// its unused lease back at once, in a call of its own that also reports
// what it admitted from the lease (that call is a peek when there is
// nothing to give back but something to report). Recalls of keys it
// does not hold cost nothing. Safe to call from any goroutine; the
// return runs on its own.
func (c *Cache) Recalled(key []byte, kind algo.Kind, now time.Time) {
	if c.closed.Load() {
		return
	}
	recallsReceived.Inc()
	ns := now.UnixNano()
	sh := c.shard(key)
	sh.mu.Lock()
	e := sh.m[string(key)]
	if e == nil || e.p.Kind != kind {
		sh.mu.Unlock()
		return
	}
	e.deniedUntil, e.answerAt, e.peekUntil = 0, 0, 0
	e.noLeaseUntil = ns + int64(c.o.SyncInterval)
	var op algo.Op
	switch {
	case e.lease > 0:
		op = c.heldOp(algo.OpRefund, e, e.lease)
		op.TakenAt = e.leaseAt
		e.lease = 0
		recallsReturned.Inc()
	case e.spent != 0:
		// Nothing to give back, but what the lease admitted is still
		// counted out: a reset about to happen would leave it out.
		op = c.reportOp(e)
	default:
		sh.mu.Unlock()
		return
	}
	op.Key = bytes.Clone(key)
	sh.mu.Unlock()
	c.running.Add(1)
	go func() {
		defer c.running.Add(-1)
		ops := []algo.Op{op}
		err := c.b.Sync(context.Background(), ops)
		switch {
		case err != nil || ops[0].Err != nil:
			syncErrors.Inc()
			if op.Kind == algo.OpRefund {
				leasesLost.Add(int(op.N))
			}
		case op.Kind == algo.OpRefund:
			leasesReturn.Add(int(op.N))
		}
	}()
}

// Close stops the cache taking checks and returns every lease it holds,
// in one Backend.Sync bounded by ctx. Checks after Close fail with
// ErrClosed.
func (c *Cache) Close(ctx context.Context) error {
	c.closed.Store(true)
	// A store call still running (its caller may have stopped waiting)
	// may bring a lease: let it land before collecting.
	for c.running.Load() > 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	var ops []algo.Op
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		for key, e := range sh.m {
			if e.lease > 0 {
				op := c.heldOp(algo.OpRefund, e, e.lease)
				op.Key, op.TakenAt = []byte(key), e.leaseAt
				ops = append(ops, op)
				e.lease = 0
			}
		}
		sh.mu.Unlock()
	}
	c.orphanMu.Lock()
	ops = append(ops, c.orphans...)
	c.orphans = nil
	c.orphanMu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	err := c.b.Sync(ctx, ops)
	for i := range ops {
		if err == nil && ops[i].Err == nil {
			leasesReturn.Add(int(ops[i].N))
		} else {
			leasesLost.Add(int(ops[i].N))
		}
	}
	return err
}
