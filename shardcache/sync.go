package shardcache

import (
	"bytes"
	"cmp"
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
	keys []byte   // the ops' keys, back to back
	due  []dueRef // the entries of one shard due at a tick

	visits int64 // entries visited, as rld_cache_sync_visits_total counts them for every Cache
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
// hot keys, and drops entries idle for two syncs, in at most sendCalls
// Backend.Sync calls of sendChunk ops or more (chunkSize). It visits
// only the entries due (see schedule), never holding a shard lock for
// more than syncChunk of them. It reports how many ops it sent. Run calls it every interval.
func (c *Cache) Sync(now time.Time) int {
	if c.closed.Load() {
		return 0
	}
	start := time.Now() // for the duration metric only
	ns := now.UnixNano()
	peers := c.peers()
	n := c.syncN.Add(1)
	b := &c.sync
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.reset()
	for i := range c.shards {
		sh := &c.shards[i]
		c.visitDue(sh, ns, func(e *entry) {
			c.catchUp(e, n-1)
			e.synced = n
			if op, ok := c.plan(e, ns, peers); ok {
				b.add(op, sh, e.key, e)
			}
			if e.idleSyncs >= 2 && e.lease == 0 && ns >= e.deniedUntil {
				if e.spent != 0 && c.o.Holder != "" {
					b.add(c.reportOp(e), sh, e.key, e)
				}
				e.due = dead
				delete(sh.m, e.key)
				c.entries.Add(-1)
				liveEntries.Add(-1)
				return
			}
			c.reschedule(sh, e, ns)
		})
	}
	c.orphanMu.Lock()
	for _, op := range c.orphans {
		b.add(op, nil, "", nil)
	}
	clear(c.orphans)
	c.orphans = c.orphans[:0]
	c.orphanMu.Unlock()
	syncs.Inc()
	if len(b.ops) > 0 {
		b.seal()
		c.send(b.ops, b.refs)
	}
	syncDuration.UpdateDuration(start)
	return len(b.ops)
}

// wheelSlots is the number of ticks (half sync intervals) a shard's
// wheel spans: 12.8 s at the default interval. An entry due later is
// put in its last slot and visited then, early, to be put back.
const wheelSlots = 256

// maxSlotCap is the largest array a wheel's slot keeps for its next
// round.
const maxSlotCap = 256

// dead is the due of an entry dropped from its shard's map.
const dead = -1

// dueRef is an entry in a wheel's slot, for its visit at tick due. It
// is stale, and skipped, once the entry's due is another (visited,
// moved earlier, or dropped).
type dueRef struct {
	e   *entry
	due int64
}

// syncChunk is the most entries the sync loop visits under one hold of
// a shard's lock: a tick with many leases due (warm leases granted
// together, lapsing together) does not hold a shard's checks for long.
const syncChunk = 256

// sendChunk is the fewest ops the sync loop puts in one Backend.Sync of
// a tick that has more, and sendCalls the most calls a tick makes, one
// after the other. Sync ops share the store's pipelined connections
// with checks, and Redis runs a connection's commands in order, so a
// check written behind a sync call waits for all of it. A lease script
// call costs Redis 50-100 µs of CPU on a small machine: 8 of them hold
// a check for well under a millisecond, where the one call of a whole
// tick the loop used to send (up to 256 ops, 36 on average in an open
// loop of 10,000 checks/s) held the checks behind it 5 ms on average,
// and a full one would hold them for 13 ms (256 × 50 µs). A tick with
// more than sendChunk × sendCalls ops (a daemon holding 100,000 warm
// leases sends 230-260 a tick) makes larger calls rather than more, so that it
// ends within sendCalls round trips, well inside the interval, however
// slow Redis is under load.
const (
	sendChunk = 8
	sendCalls = 16
)

// chunkSize returns how many of a tick's n ops each Backend.Sync
// carries: sendChunk, or more when n would need more than sendCalls
// calls.
func chunkSize(n int) int { return max(sendChunk, (n+sendCalls-1)/sendCalls) }

// tick returns the sync loop's tick of local time ns: half sync
// intervals since the epoch, rounded up.
func (c *Cache) tick(ns int64) int64 { return (ns + c.half - 1) / c.half }

// schedule puts e, in sh whose lock the caller holds, in the wheel's
// slot of tick, or in the list of the next tick the loop visits if that
// is later (tick 0: the next one), unless it is due no later already.
// Once the list has grown to a tick's traffic it allocates nothing: a
// check (touch) only ever adds to the list, which keeps its array from
// one tick to the next.
func (c *Cache) schedule(sh *shard, e *entry, tick int64) {
	tick = min(max(tick, sh.cursor+1), sh.cursor+wheelSlots)
	if e.due > sh.cursor && e.due <= tick {
		return
	}
	e.due = tick
	if tick == sh.cursor+1 {
		sh.soon = append(sh.soon, dueRef{e: e, due: tick})
		return
	}
	slot := &sh.wheel[tick%wheelSlots]
	*slot = append(*slot, dueRef{e: e, due: tick})
}

// reschedule puts e, just visited at ns, back in the wheel for when it
// next needs the loop: the next tick while it saw checks since the last
// sync, holds a lease that goes back when idle, or holds nothing (it is
// dropped after two idle syncs); a denial's end when that is later; for
// a warm lease, when its lifetime nears its end (see planWarm). The
// caller holds sh's lock.
func (c *Cache) reschedule(sh *shard, e *entry, ns int64) {
	switch {
	case e.seen || (e.lease > 0 && !e.warm):
		c.schedule(sh, e, 0)
	case e.lease == 0:
		c.schedule(sh, e, c.tick(e.deniedUntil))
	default:
		c.schedule(sh, e, c.tick(e.leaseUntil-3*int64(c.o.SyncInterval)))
	}
}

// touch records a check of e, in sh whose lock the caller holds, at ns:
// its first since the last sync brings its rates up to date and puts it
// in the next tick's slot, unless it is a take (not a peek) and e is
// quiet.
func (c *Cache) touch(sh *shard, e *entry, ns int64, take bool) {
	e.lastUse = max(e.lastUse, ns)
	if e.seen || (take && quiet(e, ns)) {
		return
	}
	e.seen = true
	c.catchUp(e, c.syncN.Load())
	c.schedule(sh, e, 0)
}

// quiet reports whether a take of e at ns can leave e out of the sync
// loop's next ticks: e holds a warm lease of more than twice the
// traffic the key had per interval (its smoothed rate) and has had
// since the loop last visited it (e.used), and has no denial since then
// or in force, so the loop would have nothing to do with it before its
// lifetime nears its end, where the wheel already has it (see
// reschedule). What a quiet entry's takes admit adds up in e.used; the
// loop's next visit spreads that over the syncs it spans (catchUp). A
// take that the store answers touches e again (runMiss): a denial, or a
// lease that is not warm, puts it in the next tick's slot. Most keys of
// a long tail hold such a lease, and visiting each of them at the two
// ticks after each interval it was checked in was most of the loop's
// work. The caller holds e's shard lock.
func quiet(e *entry, ns int64) bool {
	return e.warm && e.denials == 0 && ns >= e.deniedUntil && e.lease > 2*(e.rate+e.used)
}

// catchUp brings e's smoothed rates up to n Syncs. If e admitted
// nothing since its rates were last brought up to date (e.used is 0),
// each of those Syncs is one idle step of plan's smoothing: a check puts
// an entry in the next tick's slot unless it is a quiet take. If it
// did, it was quiet: what it used is spread evenly over those Syncs (the
// last 64 of them) and the interval under way, whose share is left in
// e.used for plan. The caller holds e's shard lock.
func (c *Cache) catchUp(e *entry, n int64) {
	k := n - e.synced
	if k <= 0 {
		return
	}
	e.synced = n
	if e.used > 0 {
		if k > 64 { // the rates forget what is older
			e.used -= e.used * (k - 64) / (k + 1)
			k = 64
		}
		total := e.used
		for i := range k {
			left := total * (k - i) / (k + 1) // the share of the later intervals
			e.rate = (e.rate + e.used - left + 1) / 2
			e.denyRate = (e.denyRate + 1) / 2
			e.used = left
		}
		e.idleSyncs = 0
		return
	}
	e.idleSyncs += int(min(k, 1<<20))
	// (r+1)/2 reaches 1 from any r ≥ 1 (0 stays 0) within 64 steps.
	for range min(k, 64) {
		if e.rate <= 1 && e.denyRate <= 1 {
			break
		}
		e.rate = (e.rate + 1) / 2
		e.denyRate = (e.denyRate + 1) / 2
	}
}

// visitDue calls visit, holding sh's lock, for each entry of sh due at
// ns: those in the wheel's slots from the one after the last visited up
// to ns's (at least one slot: a tick is never skipped, whatever the
// clock), syncChunk of them per hold of the lock. visit has taken the
// entry out of the wheel; it puts it back (reschedule) or drops it. The
// caller holds c.sync.mu.
func (c *Cache) visitDue(sh *shard, ns int64, visit func(e *entry)) {
	b := &c.sync
	sh.mu.Lock()
	to := max(ns/c.half, sh.cursor+1)
	from := max(sh.cursor+1, to-wheelSlots+1)
	take := func(refs []dueRef) {
		for _, r := range refs {
			if r.e.due == r.due && r.due <= to {
				b.due = append(b.due, r)
			}
		}
		clear(refs)
	}
	take(sh.soon)
	sh.soon = sh.soon[:0]
	for t := from; t <= to; t++ {
		slot := &sh.wheel[t%wheelSlots]
		take(*slot)
		if cap(*slot) > maxSlotCap {
			*slot = nil // a burst's array is not kept for a whole round
		} else {
			*slot = (*slot)[:0]
		}
	}
	sh.cursor = to
	for i, r := range b.due {
		if i > 0 && i%syncChunk == 0 {
			sh.mu.Unlock()
			sh.mu.Lock()
		}
		// A dropped entry's due is dead, which no ref holds: no map
		// lookup is needed to skip it.
		if r.e.due != r.due {
			continue // checked meanwhile (due at the next tick), or dropped
		}
		r.e.due = 0
		b.visits++
		syncVisits.Inc()
		visit(r.e)
	}
	sh.mu.Unlock()
	clear(b.due)
	b.due = b.due[:0]
}

// send runs ops in Backend.Sync calls of chunkSize(len(ops)) ops, one
// after the other, and applies each outcome to the entry of its ref.
func (c *Cache) send(ops []algo.Op, refs []syncRef) {
	size := chunkSize(len(ops))
	for len(ops) > 0 {
		n := min(len(ops), size)
		sent := c.o.Clock().UnixNano()
		if err := c.b.Sync(context.Background(), ops[:n]); err != nil {
			for i := range ops[:n] {
				ops[i].Err = err
			}
		}
		for i := range ops[:n] {
			c.apply(&ops[i], refs[i], sent)
		}
		syncOps.Add(n)
		ops, refs = ops[n:], refs[n:]
	}
}

// plan updates e's rates for the interval that ended at ns and returns
// the op e needs, if any. The caller holds e's shard lock.
func (c *Cache) plan(e *entry, ns, peers int64) (algo.Op, bool) {
	e.rate = (e.rate + e.used + 1) / 2
	e.denyRate = (e.denyRate + e.denials + 1) / 2
	if e.seen || e.used > 0 { // used: a quiet entry's checks
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
		return c.returnOp(e, c.goneReason(e, ns)), true
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
// since its last op; when not, a bucket's lease that its refill brings
// back within a sync interval lapses with no call (its units, lost, come
// back with the refill; the store stops counting them out when the
// lifetime it was told ends; see refillsSoon). Otherwise its return. A
// lease that ends with its window is planWarmWindow's. The caller holds
// e's shard lock.
func (c *Cache) planWarm(e *entry, ns, peers int64) (algo.Op, bool) {
	if e.inWindow {
		return c.planWarmWindow(e, ns, peers)
	}
	interval := int64(c.o.SyncInterval)
	ending := e.leaseUntil-ns <= 3*interval
	if !ending && (e.lease > 2*e.rate || e.spent <= 0) {
		return algo.Op{}, false
	}
	if limit := c.remaining(e, ns); ns < e.leaseUntil && ns >= e.noLeaseUntil && c.far(e, limit) {
		switch {
		case e.spent > 0:
			want := min(c.warmWant(e, e.rate, ns), limit/(2*peers)) - e.lease
			if ending {
				want = max(want, 1) // a grant extends the lifetime
			}
			if want > 0 {
				return c.renewWarmOp(e, want), true
			}
		case !windowed(e.p.Kind) && c.refillsSoon(e.p, e.lease):
			lapse(e, missLapsed)
			return algo.Op{}, false
		}
		// A window's units lapsed would be lost until the window ends
		// (an hour's, for an hour), and a slow bucket's until it
		// refills: they go back.
	}
	return c.returnOp(e, c.goneReason(e, ns)), true
}

// planWarmWindow is planWarm for a warm lease that lapses with its
// window: no op while it holds more than two intervals of the key's
// traffic or was not used since its last op, until its window ends (see
// endOfWindow). Else, while the key is far from its limit, a renewal
// topped up to warmIntervals of traffic or to the traffic until the
// window ends, if that is more than it holds; otherwise its return. No
// grant extends its lifetime: the window ends it. The caller holds e's
// shard lock.
func (c *Cache) planWarmWindow(e *entry, ns, peers int64) (algo.Op, bool) {
	if op, send, done := c.endOfWindow(e, ns); done {
		return op, send
	}
	if e.lease > 2*e.rate || e.spent <= 0 {
		return algo.Op{}, false
	}
	if limit := c.remaining(e, ns); ns >= e.noLeaseUntil && c.far(e, limit) {
		if want := min(c.warmWant(e, e.rate, ns), limit/(2*peers)) - e.lease; want > 0 {
			return c.renewWarmOp(e, want), true
		}
		return algo.Op{}, false
	}
	return c.returnOp(e, missReturned), true
}

// refillsSoon reports whether a bucket of p refills units within one
// sync interval, so that a warm lease of that many left to lapse costs
// a burst nothing: a lease of a key whose limit is far above its
// traffic. Units lapsed refill at the limit's rate; those of a slow
// limit (1,000 an hour: 256 units are 15 min of it) would be out of
// the bucket long enough to refuse a burst within its capacity, and go
// back instead, one call a lease lifetime.
func (c *Cache) refillsSoon(p algo.Params, units int64) bool {
	return float64(units)*float64(p.Period) <= float64(p.Limit)*float64(c.o.SyncInterval)
}

// endOfWindow ends e's warm lease that lapses with its window, when its
// window is about to end or has: a sliding counter's goes back before
// the next tick, while its window is current (units left out would
// weigh on the next window's estimate); a fixed window's lapses at the
// window's end with no call (its units are lost with the window, which
// no later decision reads, and the store stops counting them out then).
// It returns the op to send, if any, and whether e's lease has ended.
// The caller holds e's shard lock.
func (c *Cache) endOfWindow(e *entry, ns int64) (op algo.Op, send, done bool) {
	switch {
	case e.p.Kind.Info().Leases == algo.LeaseWindowReturned && e.leaseUntil-ns < int64(c.o.SyncInterval)/2:
		return c.returnOp(e, missWindow), true, true
	case e.p.Kind.Info().Leases == algo.LeaseWindowLost && ns >= e.leaseUntil:
		// What the lease admitted counted against its window's units
		// out, which the store drops with the window.
		lapse(e, missWindow)
		return algo.Op{}, false, true
	}
	return algo.Op{}, false, false
}

// renewEarly returns the renewal of e's warm lease at a ReturnIdle tick
// at ns, half an interval after a sync, when the lease holds no more
// than an interval of the key's traffic, or than it used since that
// sync: renewed now, the lease is topped up before it runs out, where
// waiting for the next sync would leave the key's next checks to the
// store. Only a key still far from its limit is renewed here; the rest
// waits for the sync (planWarm). The caller holds e's shard lock.
func (c *Cache) renewEarly(e *entry, ns, peers int64) (algo.Op, bool) {
	rate := max(e.rate, e.used) // e.used: since the sync half an interval ago
	if !e.warm || e.lease <= 0 || e.spent <= 0 || e.lease > rate ||
		ns >= e.leaseUntil || ns < e.noLeaseUntil ||
		(e.inWindow && e.leaseUntil-ns < int64(c.o.SyncInterval)) {
		return algo.Op{}, false
	}
	limit := c.remaining(e, ns)
	if !c.far(e, limit) {
		return algo.Op{}, false
	}
	want := min(c.warmWant(e, rate, ns), limit/(2*peers)) - e.lease
	if want <= 0 {
		return algo.Op{}, false
	}
	return c.renewWarmOp(e, want), true
}

// minSyncRate is the fewest units per sync interval a key must use for
// the sync to renew its lease or refresh its view.
const minSyncRate = 4

// apply records the outcome of one sync op sent at local time sent.
func (c *Cache) apply(op *algo.Op, ref syncRef, sent int64) {
	if op.Err != nil {
		syncErrors.Inc()
		if notSent(op.Err) && c.keep(op, ref) {
			return
		}
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
		c.schedule(ref.sh, e, c.tick(e.leaseUntil-3*int64(c.o.SyncInterval)))
		if ret, ok := c.lateRecall(e, ref.key, sent); ok {
			c.giveBack(ret)
		}
	}
	c.learn(e, op.Result, sent)
}

// keep takes back what op, of ref, did not send (a circuit breaker
// refused it), so that a later op sends it: a return's units go back
// into the entry's lease while it is the lease they came from and has
// not lapsed, with the spent units the op was to report; otherwise the
// return is queued as an orphan, sent again at the next sync. Another
// op's spent units go back into the entry. It reports whether op's
// units were kept. Dropped, they would stay counted out at the store
// with no daemon holding them (see Cache.unsent).
func (c *Cache) keep(op *algo.Op, ref syncRef) bool {
	var e *entry
	if ref.sh != nil {
		ref.sh.mu.Lock()
		defer ref.sh.mu.Unlock()
		if e = ref.sh.m[ref.key]; e != ref.e || e.p != op.Params {
			e = nil
		}
	}
	switch {
	case op.Kind == algo.OpRefund && e != nil && op.TakenAt == e.leaseAt && op.SpentAt == e.leaseAt && c.o.Clock().UnixNano() < e.leaseUntil:
		e.lease += op.N
		e.spent += op.Spent
		c.schedule(ref.sh, e, 0)
	case op.Kind == algo.OpRefund:
		retry := *op
		retry.Key, retry.Err = bytes.Clone(op.Key), nil
		c.orphanMu.Lock()
		c.orphans = append(c.orphans, retry)
		c.orphanMu.Unlock()
	case e != nil && mayRespend(e, op.SpentAt):
		e.spent += op.Spent
	default:
		return false
	}
	return true
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

// goneReason returns why e's lease, returned by the sync loop at ns,
// is gone: its window or lifetime ends, or it went back.
func (c *Cache) goneReason(e *entry, ns int64) missReason {
	switch {
	case windowed(e.p.Kind) && e.leaseUntil-ns < int64(c.o.SyncInterval)/2:
		return missWindow
	case ns >= e.leaseUntil:
		return missLapsed
	}
	return missReturned
}

// idle reports whether e saw no check in the last half sync interval.
func (c *Cache) idle(e *entry, ns int64) bool {
	return e.lastUse < ns-int64(c.o.SyncInterval)/2
}

// ReturnIdle returns the leases of the keys that saw no check in the
// last half sync interval, and renews the warm leases that run low (see
// renewEarly), visiting only the entries due, as Sync does. Run calls it
// between syncs.
func (c *Cache) ReturnIdle(now time.Time) int {
	if c.closed.Load() {
		return 0
	}
	ns := now.UnixNano()
	peers := c.peers()
	b := &c.sync
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.reset()
	for i := range c.shards {
		sh := &c.shards[i]
		c.visitDue(sh, ns, func(e *entry) {
			c.catchUp(e, c.syncN.Load())
			if e.lease > 0 && e.warm && e.inWindow {
				if op, send, done := c.endOfWindow(e, ns); done {
					if send {
						b.add(op, sh, e.key, e)
					}
					c.reschedule(sh, e, ns)
					return
				}
			}
			if e.lease > 0 && c.returnable(e, ns) {
				b.add(c.returnOp(e, c.goneReason(e, ns)), sh, e.key, e)
			} else if op, ok := c.renewEarly(e, ns, peers); ok {
				b.add(op, sh, e.key, e)
			}
			c.reschedule(sh, e, ns)
		})
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
	forgetView(e, c.o.Clock().UnixNano())
	e.noLeaseUntil = ns + int64(c.o.SyncInterval)
	c.schedule(sh, e, 0) // an entry without a lease is dropped when idle
	var op algo.Op
	switch {
	case e.lease > 0:
		op = c.returnOp(e, missRecalled)
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
	c.giveBack(op)
}

// recalledSince reports whether e's key was recalled (Recalled) at or
// after local time sent: noLeaseUntil is a sync interval after the
// recall. The caller holds e's shard lock.
func (c *Cache) recalledSince(e *entry, sent int64) bool {
	return e.noLeaseUntil != 0 && e.noLeaseUntil-int64(c.o.SyncInterval) >= sent
}

// lateRecall returns the return of e's lease, key's, when the key was
// recalled after sent, the time the call that just granted units of the
// lease was sent: the recall found that grant still out and nothing (or
// less) to give back, and the recalling daemon waits for those units,
// which this daemon's burst may be over with. Handled as Recalled
// would have, had it come after the grant. ok is false when there is
// nothing to return. The caller holds e's shard lock and sends the
// return with giveBack.
func (c *Cache) lateRecall(e *entry, key string, sent int64) (op algo.Op, ok bool) {
	if e.lease <= 0 || !c.recalledSince(e, sent) {
		return algo.Op{}, false
	}
	op = c.returnOp(e, missRecalled)
	op.Key = []byte(key)
	lateRecalls.Inc()
	return op, true
}

// giveBack sends op, the return of a recalled lease or the report of
// what it admitted, in a call of its own.
func (c *Cache) giveBack(op algo.Op) {
	c.running.Add(1)
	go func() {
		defer c.running.Add(-1)
		ops := []algo.Op{op}
		err := cmp.Or(c.b.Sync(context.Background(), ops), ops[0].Err)
		switch {
		case err != nil && notSent(err) && op.Kind == algo.OpRefund:
			// Sent again by the next sync, as an orphan's return: its
			// entry has let it go.
			syncErrors.Inc()
			ops[0].Err = nil
			c.orphanMu.Lock()
			c.orphans = append(c.orphans, ops[0])
			c.orphanMu.Unlock()
		case err != nil:
			syncErrors.Inc()
			if op.Kind == algo.OpRefund {
				leasesLost.Add(int(op.N))
			}
		case op.Kind == algo.OpRefund:
			leasesReturn.Add(int(op.N))
		}
	}()
}

// Corrected handles another daemon's announcement that units of key,
// under algorithm kind, went back to the store (Options.Refunded: a
// settle's refund): the entry drops its denial and its view of the
// key's remaining quota, which are from before the refund, so that the
// key's next check asks the store, and keeps no denial from a call
// sent before now, or at the same time (its answer may be from before
// the refund too; its view, which may know too little quota but never
// too much, is kept).
// Its lease, counted at the store already, stays. Keys it does not hold
// cost nothing. Safe to call from any goroutine.
func (c *Cache) Corrected(key []byte, kind algo.Kind) {
	if c.closed.Load() {
		return
	}
	refundsReceived.Inc()
	c.dropView(key, kind)
}

// dropView drops the entry of key under kind's denial and view, as of
// now (see Corrected).
func (c *Cache) dropView(key []byte, kind algo.Kind) {
	sh := c.shard(key)
	sh.mu.Lock()
	if e := sh.m[string(key)]; e != nil && e.p.Kind == kind {
		forgetView(e, c.o.Clock().UnixNano())
	}
	sh.mu.Unlock()
}

// forgetView drops what e knows of the store's state of its key (its
// denial, its view of the remaining quota), which a change of the key
// at the store (a reset, a refund) made wrong, and the denials of calls
// sent at or before at (Options.Clock), and the denials counted before it: a key
// hammered before the change is not refused on that account after it,
// nor takes its whole share of the room the change made (see leaseWant)
// without recalling what other daemons lease of it. The caller holds
// e's shard lock.
func forgetView(e *entry, at int64) {
	e.deniedUntil, e.answerAt, e.peekUntil = 0, 0, 0
	e.denials, e.denyRate = 0, 0
	e.staleBefore = max(e.staleBefore, at)
	if e.gone == missDenied {
		e.gone = missRecalled
	}
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
