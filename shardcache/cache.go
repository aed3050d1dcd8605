package shardcache

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/coalesce"
	"github.com/rld/rld/deadline"
)

// Defaults of Options.
const (
	DefaultSyncInterval = 100 * time.Millisecond
	DefaultMaxEntries   = 100_000
	DefaultShards       = 64
	DefaultTimeout      = deadline.DefaultStore // the store's own: redisx's default too
)

// Options configures a Cache. The zero value of each field means its
// default.
type Options struct {
	// SyncInterval is how often the sync loop runs (DefaultSyncInterval).
	// A lease is sized to about one interval of a key's local traffic.
	SyncInterval time.Duration
	// MaxEntries bounds the keys held (DefaultMaxEntries). A new key in a
	// full cache evicts another, whose lease is returned at the next sync.
	MaxEntries int
	// Shards is the number of lock stripes, rounded up to a power of two
	// (DefaultShards).
	Shards int
	// Timeout bounds each store call of the cache (DefaultTimeout): the
	// store's own timeout. A check that finds a call of its key out
	// waits for that call and then its own, so at most twice Timeout:
	// at a burst's edge the call out may be held by a recall, and a
	// check queued behind it with one Timeout in all would be answered
	// by the fail mode while the store answers in time.
	Timeout time.Duration
	// Peers returns how many daemons share the store, this one included;
	// leases are capped at the key's remaining quota over twice that. Nil,
	// or a result below 1, means 1.
	Peers func() int
	// Clock tells the time of the calls the cache sends, which it maps
	// to the store's clock, and of a windowed lease's last use (nil:
	// time.Now). Checks, syncs and returns take their time as an
	// argument; a test drives all of them with one fake clock.
	Clock func() time.Time
	// Holder is this daemon's id among the store's lease holders. When
	// set, the store keeps the units the daemon has out on lease of each
	// key (algo.Op's Holder): every op the cache sends for a key carries
	// the units admitted from its lease since the last one, a reset
	// leaves them out, and a refused take learns the units other daemons
	// hold. Empty: no accounting, and no recalls.
	Holder string
	// Recall, when set with Holder, asks the other daemons to give the
	// lease of key (under algorithm kind) back at once (see
	// Cache.Recalled): a take refused while they hold unused units of
	// the key then waits for them, up to RecallWait, instead of being
	// refused on the strength of quota parked in their leases. A reset
	// calls it too, so that they drop their view of the key.
	Recall func(ctx context.Context, key []byte, kind algo.Kind) error
	// Refunded, when set, tells the other daemons that units of key
	// (under algorithm kind) went back to the store (see Cache.Corrected):
	// a settle's refund through Cache.Do announces itself so, so that a
	// denial another daemon holds of the key, from before the refund,
	// does not refuse checks the refund made room for.
	Refunded func(ctx context.Context, key []byte, kind algo.Kind) error
	// RecallWait bounds how long a refused take waits for recalled
	// units, retrying the store meanwhile (Timeout / 2 when 0): at most
	// that much is added to a check's latency, and only when other
	// daemons hold parked units of a key that is at its limit.
	RecallWait time.Duration
}

func (o Options) withDefaults() Options {
	if o.SyncInterval <= 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.Shards <= 0 {
		o.Shards = DefaultShards
	}
	o.Shards = 1 << bits.Len(uint(o.Shards-1))
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.RecallWait <= 0 {
		o.RecallWait = o.Timeout / 2
	}
	return o
}

// Cache is the hot-key cache of cached rules; it implements policy.Store.
// Create it with New; it is safe for concurrent use. Run its sync loop
// with Run and return its leases with Close.
type Cache struct {
	b       Backend
	o       Options
	shards  []shard
	mask    uint64
	entries atomic.Int64
	miss    *coalesce.Group[missReq, missResp]
	strict  *coalesce.Group[missReq, missResp]
	peeks   *coalesce.Group[missReq, missResp]

	// orphans are leases of entries that were evicted or replaced: the
	// next sync returns them.
	orphanMu sync.Mutex
	orphans  []algo.Op

	sync  syncBuf      // the ops of Sync and ReturnIdle
	syncN atomic.Int64 // Syncs started: an entry's rates are smoothed up to e.synced of them
	half  int64        // half a sync interval, ns: the sync loop's tick and the wheel's slot

	closed    atomic.Bool
	running   atomic.Int64 // runMiss calls in progress
	slowUntil atomic.Int64 // unix ns: until then, take-with-leases are waited for off the flight (see takeLeaseOrLate)
}

type shard struct {
	mu sync.Mutex
	m  map[string]*entry // guarded by mu
	// wheel holds, guarded by mu, the entries of m that the sync loop
	// must visit, each in the slot of the tick it is due at (see
	// schedule): the loop visits only those, never the whole map.
	wheel  [][]dueRef
	soon   []dueRef // the entries due at the next tick, cursor+1
	cursor int64    // the last tick whose slot was taken, in half sync intervals since the epoch
	_      [56]byte // keeps the next shard's lock off this one's cache line
}

// entry is what the cache knows of one key. All times are local unix ns
// except leaseAt, which is the store's clock in µs.
type entry struct {
	p   algo.Params
	key string // its key in the shard's map (the same string)

	due    int64 // the tick of its visit by the sync loop (0: none; dead: dropped)
	synced int64 // the Syncs (Cache.syncN) its rates were smoothed for

	lease      int64 // leased units not yet admitted
	leaseAt    int64 // store µs when the lease was taken (Result.At)
	leaseUntil int64 // the lease may be used before this time

	deniedUntil int64 // deny costs ≥ deniedCost until this time
	deniedCost  int64

	remaining int64 // the store's remaining quota at the last answer
	answerAt  int64 // when that answer was asked for (0: never)
	resetAt   int64 // when the store's limit fully resets
	windowEnd int64 // windowed algorithms: when the answer's window ends
	peekUntil int64 // a denial's peeks may be answered from the answer until then
	lastUse   int64 // the time of the last check of the key

	used      int64 // units admitted since the last sync, or the sync loop's last visit if quiet
	rate      int64 // units admitted per sync interval, smoothed
	denials   int64 // checks denied since the last sync
	denyRate  int64 // checks denied per sync interval, smoothed
	idleSyncs int   // syncs in a row that saw no check
	seen      bool  // a check came since the last sync
	warm      bool  // the lease was granted far from the limit: kept, renewed when low (see warmIntervals)
	inWindow  bool  // the lease lapses with its window, before its lifetime (windowed algorithms)

	spent        int64      // units admitted from the lease not yet reported to the store
	noLeaseUntil int64      // recalled: lease nothing more until then
	staleBefore  int64      // an answer to a call sent at or before this time (Options.Clock) installs no denial: the key changed since
	gone         missReason // why the lease is empty, when it is
}

// missReason is why a check of a cached rule could not be answered from
// its key's lease and waited on the store: the label of
// rld_cache_misses_total.
type missReason uint8

const (
	missNew      missReason = iota // the key's first check (or first since its entry was dropped)
	missSpent                      // the lease ran out, or holds less than the cost
	missLapsed                     // the lease's lifetime ended
	missWindow                     // the lease's window ended
	missReturned                   // the lease went back to the store (idle, or its key came near its limit)
	missRecalled                   // another daemon recalled the lease
	missDenied                     // a local denial ended, or was for a larger cost
	missNoLease                    // the store granted no lease (the key near or over its limit)
)

// missReason returns why e could not answer a check of cost at ns from
// its lease. The caller holds e's shard lock.
func (c *Cache) missReason(e *entry, ns, cost int64) missReason {
	switch {
	case e.answerAt == 0 && e.leaseAt == 0:
		return missNew
	case ns < e.noLeaseUntil:
		return missRecalled
	case e.lease > 0 && ns >= e.leaseUntil && windowed(e.p.Kind):
		return missWindow
	case e.lease > 0 && ns >= e.leaseUntil:
		return missLapsed
	case e.lease > 0:
		return missSpent // less than cost
	case ns < e.deniedUntil:
		return missDenied // for less than cost
	}
	return e.gone
}

// New returns a Cache in front of b.
func New(b Backend, o Options) *Cache {
	o = o.withDefaults()
	c := &Cache{b: b, o: o, shards: make([]shard, o.Shards), mask: uint64(o.Shards - 1), half: max(int64(o.SyncInterval/2), 1)}
	start := o.Clock().UnixNano()/c.half - 1
	for i := range c.shards {
		c.shards[i].m = make(map[string]*entry)
		c.shards[i].wheel = make([][]dueRef, wheelSlots)
		c.shards[i].cursor = start
	}
	c.miss = coalesce.New(c.runMiss, coalesce.Options{})
	c.strict = coalesce.New(c.runStrict, coalesce.Options{})
	c.peeks = coalesce.New(c.runPeek, coalesce.Options{})
	return c
}

func (c *Cache) shard(key []byte) *shard {
	return &c.shards[xxhash.Sum64(key)&c.mask]
}

// Len returns the number of keys the cache holds.
func (c *Cache) Len() int { return int(c.entries.Load()) }

// ErrClosed is returned by checks on a closed Cache.
var ErrClosed = errors.New("shardcache: closed")

// Take decides cost units of p for key, locally when the key's lease or
// denial covers the check and through the store otherwise; see the
// package doc. A cost below 1 counts as 1. It implements policy.Store.
func (c *Cache) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	if peek {
		return c.peek(ctx, key, p, max(cost, 1), now, 0)
	}
	cost = max(cost, 1)
	if r, ok := c.TakeLocal(key, p, cost, now, false); ok {
		return r, nil
	}
	if c.closed.Load() {
		return algo.Result{}, ErrClosed
	}
	ns := now.UnixNano()
	// The key's call out (≤ Timeout), then this check's (≤ Timeout).
	ctx, cancel := context.WithTimeout(ctx, 2*c.o.Timeout)
	res, err := c.miss.Do(ctx, key, missReq{p: p, cost: cost, ns: ns})
	cancel()
	if err != nil {
		return algo.Result{}, fmt.Errorf("shardcache: %w", err)
	}
	return res.r, nil
}

// TakeLocal decides cost units of p for key as Take does when the key's
// lease or denial (or, for a peek, what the cache knows: see the package
// doc) answers it with no store call, and reports whether it did. It
// implements policy.LocalTaker.
func (c *Cache) TakeLocal(key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, bool) {
	cost = max(cost, 1)
	ns := now.UnixNano()
	sh := c.shard(key)
	sh.mu.Lock()
	e := sh.m[string(key)]
	if e == nil || e.p != p || c.closed.Load() {
		sh.mu.Unlock()
		return algo.Result{}, false
	}
	c.touch(sh, e, ns, !peek)
	var r algo.Result
	var ok bool
	if peek {
		r, ok = c.peekLocal(e, ns, cost, false)
	} else {
		r, ok = c.local(e, ns, cost, false)
	}
	sh.mu.Unlock()
	if ok {
		countLocal(r)
	}
	return r, ok
}

// countLocal counts a decision r made on the host.
func countLocal(r algo.Result) {
	if r.Allowed {
		localAllowed.Inc()
	} else {
		localDenied.Inc()
	}
}

// local answers a check from e when it can: from the lease, or from a
// denial still in force.
func (c *Cache) local(e *entry, ns, cost int64, peek bool) (algo.Result, bool) {
	capacity := e.p.Capacity()
	if cost >= e.deniedCost && ns < e.deniedUntil {
		e.denials++
		return algo.Result{
			Limit: capacity, Reset: untilNs(e.resetAt, ns),
			RetryAfter: time.Duration(e.deniedUntil - ns), At: 0,
		}, true
	}
	// A windowed lease is checked against the clock itself, not just the
	// batch's time: its units belong to a window that ends at leaseUntil.
	if e.lease >= cost && ns < e.leaseUntil && (!windowed(e.p.Kind) || c.o.Clock().UnixNano() < e.leaseUntil) {
		if !peek {
			e.lease -= cost
			e.used += cost
			e.spent += cost
			if e.lease == 0 {
				e.gone = missSpent
			}
		}
		return algo.Result{
			Allowed: true, Limit: capacity,
			Remaining: min(e.remaining+e.lease, capacity),
			Reset:     untilNs(e.resetAt, ns), At: e.leaseAt,
		}, true
	}
	return algo.Result{}, false
}

// Known returns what the cache last knew, at now, of key's remaining
// quota in the store under limit p: the store's last answer with the
// refill since for a bucket, the whole limit once that answer's window has
// ended, and less than the denied cost while a denial is in force. ok is
// false when the cache holds no answer of the store for key under p. The
// units of the cache's own lease are not included: the cache admits them
// locally while the lease holds, store or no store. A Fallback starts a
// key's local state from it (policy.FallbackOptions.Seed), so that an
// outage does not hand out quota the fleet had already spent. It knows
// the keys of strict rules (Strict) as well as cached ones.
func (c *Cache) Known(key []byte, p algo.Params, now time.Time) (remaining int64, ok bool) {
	ns := now.UnixNano()
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[string(key)]
	if e == nil || e.p != p || e.answerAt == 0 {
		return 0, false
	}
	remaining = c.remaining(e, ns)
	if ns < e.deniedUntil {
		remaining = min(remaining, max(e.deniedCost-1, 0))
	}
	return max(remaining, 0), true
}

// untilNs returns the time from ns to t, or 0 when t has passed.
func untilNs(t, ns int64) time.Duration {
	return time.Duration(max(t-ns, 0))
}

// Refund gives back cost units admitted at takenAt. Units that came from
// this daemon's current lease go back to it, with no call (with
// Options.Holder, only as many as it admitted from the lease since it
// last reported to the store); others go to the store. It implements
// policy.Store.
func (c *Cache) Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	cost = max(cost, 1)
	ns := now.UnixNano()
	sh := c.shard(key)
	sh.mu.Lock()
	// With the lease accounting, only units the store still counts out
	// (admitted from the lease, not yet reported) may go back into it:
	// the lease must never hold more than the store counts out, or a
	// reset would let it admit more than a fresh key's bound.
	if e := sh.m[string(key)]; e != nil && e.p == p && takenAt.UnixMicro() == e.leaseAt && ns < e.leaseUntil &&
		(c.o.Holder == "" || e.spent >= cost) {
		e.lease += cost
		e.used = max(e.used-cost, 0)
		e.spent -= cost
		c.schedule(sh, e, 0) // a lease to return when idle
		sh.mu.Unlock()
		return nil
	}
	sh.mu.Unlock()
	return c.b.Refund(ctx, key, p, cost, takenAt, now)
}

// missReq is one check that the cache could not answer locally.
type missReq struct {
	p    algo.Params
	cost int64
	ns   int64  // the check's time, local unix ns
	keep int64  // a denial's peek: how long to keep the answer, ns
	slot uint64 // a strict acquire's slot id (Strict.TakeSlot), else 0
}

type missResp struct {
	r algo.Result
}

// runMiss decides one coalesced batch of checks of key: first from the
// lease the flight before may have brought, then by one store call that
// also leases for the key's coming traffic, then the checks under other
// limits one by one. It has one exit.
func (c *Cache) runMiss(key string, reqs []missReq, out []missResp) error {
	// Counted before closed is read, so that Close either waits for this
	// run or this run sees it closed (and leases nothing after Close).
	c.running.Add(1)
	defer c.running.Add(-1)
	err := ErrClosed
	if !c.closed.Load() {
		m := missRun{key: key, p: reqs[0].p, sh: c.shard([]byte(key)), reqs: reqs, out: out}
		c.fromLease(&m)
		// The run holds the key's coalescing flight, and with it every
		// later check of the key: its store calls together last at most
		// the store's timeout, whatever the connection does, and a
		// recall's (see recall) at most as long again. No shard lock is
		// held across a call.
		ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
		err = nil
		if m.i < m.j {
			err = c.fromStore(ctx, &m)
		}
		if err == nil {
			err = c.otherLimits(ctx, &m)
		}
		cancel()
	}
	return err
}

// missRun is one run of runMiss: a coalesced batch of checks of key.
// reqs[:i] are answered from the lease; reqs[i:j], under the first
// check's limit p, by one store call; reqs[j:], under other limits (a
// tier or a reload changed them mid-flight), one by one.
type missRun struct {
	key  string
	p    algo.Params
	sh   *shard
	reqs []missReq
	out  []missResp
	i, j int

	// What the store call asks: the lease it wants (warm: a warm
	// lease's), and the units spent from the lease since the last
	// report, with the lease's time, that it reports.
	want, spent, spentAt int64
	warm                 bool
	mayRecall            bool // a refusal may recall the other daemons' leases

	// The store call and its answer: the costs of reqs[i:j], when it
	// was sent (local unix ns), how many of them the store admitted (the
	// first ones), the units it leased, and its result.
	costs    []int64
	sent     int64
	admitted int
	leased   int64
	r        algo.Result
	// unsettled: refused with units still parked (a recall or its
	// retries did not finish in time), not the store's own refusal.
	unsettled bool
}

// fromLease answers the checks of m that the key's lease can, under the
// shard's lock, and sizes the store call for the others.
func (c *Cache) fromLease(m *missRun) {
	reqs, p := m.reqs, m.p
	m.sh.mu.Lock()
	e := c.entry(m.sh, m.key, p)
	c.touch(m.sh, e, reqs[len(reqs)-1].ns, true)
	for ; m.i < len(reqs) && reqs[m.i].p == p; m.i++ {
		r, ok := c.local(e, reqs[m.i].ns, reqs[m.i].cost, false)
		if !ok {
			break
		}
		m.out[m.i].r = r
		if r.Allowed {
			localAllowed.Inc()
		} else {
			localDenied.Inc()
		}
	}
	var need int64
	for m.j = m.i; m.j < len(reqs) && reqs[m.j].p == p; m.j++ {
		need += reqs[m.j].cost
	}
	if m.i < m.j {
		misses[c.missReason(e, reqs[m.i].ns, reqs[m.i].cost)].Add(m.j - m.i)
	}
	m.want, m.warm = c.leaseWant(e, need, reqs[0].ns)
	if m.i < m.j {
		m.spent, m.spentAt = c.takeSpent(e), e.leaseAt // the call reports it
	}
	// A key far over its limit is refused whatever the other daemons
	// hold: its recalls would only cost the store calls.
	m.mayRecall = c.o.Recall != nil && !c.hammered(e)
	m.sh.mu.Unlock()
}

// fromStore decides reqs[i:j] of m by one store call, which also leases
// for the key's coming traffic, and recalls the other daemons' leases
// when the store refused on units they hold. A failed call reports
// nothing spent (see unsent) and decides nothing.
func (c *Cache) fromStore(ctx context.Context, m *missRun) error {
	m.costs = make([]int64, m.j-m.i)
	for k := range m.costs {
		m.costs[k] = m.reqs[m.i+k].cost
	}
	m.sent = c.o.Clock().UnixNano()
	var parked int64
	var err error
	m.admitted, m.leased, parked, m.r, err = c.takeLeaseOrLate(ctx, m.key, m.p, m.costs, m.want, m.spent, m.spentAt, c.lifeFor(m.warm))
	storeCalls.Inc()
	batchSize.Update(float64(len(m.costs)))
	if err != nil {
		c.unsent(m.sh, m.key, m.p, m.spent, m.spentAt, err)
		return err
	}
	if m.admitted < len(m.costs) && parked > 0 && m.r.RetryAfter != algo.Never && m.mayRecall {
		m.admitted, m.r, m.unsettled = c.recall(m.sh, m.key, m.p, m.costs, m.admitted, m.r)
	}
	storeDecided.Add(len(m.costs))
	leasesGranted.Add(int(m.leased))
	// A warm lease was sized before the store's answer; a key this
	// daemon had not asked about counted as fresh. Near its limit
	// after all, what was leased is kept as an ordinary lease: it
	// goes back when the key goes idle, rather than staying out for
	// a warm lifetime (and, should this daemon crash, parked).
	if m.warm && 2*(m.r.Remaining+m.leased) < m.p.Capacity() {
		m.warm = false
	}
	c.answer(m)
	return nil
}

// answer keeps the store's answer to m's call in the key's entry, under
// the shard's lock, and writes the answers of reqs[i:j]: the store's
// admissions, then those that units leased meanwhile admit, then the
// denials.
func (c *Cache) answer(m *missRun) {
	m.sh.mu.Lock()
	e := c.entry(m.sh, m.key, m.p)
	c.applyLease(m.key, e, m.leased, m.r, m.sent, m.warm)
	// An answer from before a change of the key (a refund, a reset) may
	// know too little quota, never too much: its view is kept (what a
	// Fallback starts from), its denial is not.
	stale := m.sent <= e.staleBefore
	c.learn(e, m.r, m.sent)
	if m.leased == 0 && e.lease == 0 {
		e.gone = missNoLease
	}
	for k := range m.admitted {
		e.used += m.costs[k]
	}
	firstLocal := m.admitted
	fromLease := c.refusedFromLease(m, e)
	// A recall that came while the call was out found its grant still
	// out: what is left of the lease goes back now.
	ret, back := c.lateRecall(e, m.key, m.sent)
	denied := c.denial(m, e, stale)
	r := &m.r
	allowed := algo.Result{Allowed: true, Limit: m.p.Capacity(), Remaining: min(r.Remaining+e.lease, m.p.Capacity()), Reset: r.Reset, At: r.At}
	// A denial, or a lease that is not warm, needs the sync loop soon
	// though the entry was quiet before the call.
	c.touch(m.sh, e, m.reqs[len(m.reqs)-1].ns, true)
	m.sh.mu.Unlock()
	if back {
		c.giveBack(ret)
	}
	for k := range m.costs {
		switch {
		case k < firstLocal:
			m.out[m.i+k].r = allowed
		case k < m.admitted:
			m.out[m.i+k].r = fromLease[k-firstLocal]
		default:
			m.out[m.i+k].r = denied
		}
	}
}

// refusedFromLease admits from units leased meanwhile (a sync's top-up,
// a call of the flight before) the checks the store refused, in order,
// and returns their answers: refused on this daemon's own parked units,
// a check would be refused falsely. The shard's lock is held.
func (c *Cache) refusedFromLease(m *missRun, e *entry) []algo.Result {
	var fromLease []algo.Result
	for m.admitted < len(m.costs) && e.lease >= m.costs[m.admitted] {
		lr, ok := c.local(e, m.reqs[m.i+m.admitted].ns, m.costs[m.admitted], false)
		if !ok || !lr.Allowed {
			break
		}
		fromLease = append(fromLease, lr)
		localAllowed.Inc()
		m.admitted++
	}
	return fromLease
}

// denial returns the answer of the checks of m's call that stay refused
// (none: the zero Result), and keeps the denial in the key's entry unless
// the answer is stale (sent before a change of the key, which may have
// made room since). The shard's lock is held.
func (c *Cache) denial(m *missRun, e *entry, stale bool) algo.Result {
	var denied algo.Result
	if m.admitted == len(m.costs) {
		return denied
	}
	r := &m.r
	e.denials += int64(len(m.costs) - m.admitted)
	denied = algo.Result{Limit: m.p.Capacity(), Remaining: r.Remaining, Reset: r.Reset, RetryAfter: r.RetryAfter, At: r.At}
	// The answer of a call sent before the key changed (a refund, a
	// reset) is given to the checks it decided, but is not kept: the
	// change may have made room since. Nor is a refusal whose recall
	// ended with units still parked: they may be back for the next check.
	if r.RetryAfter != algo.Never && !stale {
		denied.RetryAfter = c.denialFor(e, r.RetryAfter)
		if !m.unsettled {
			e.deniedUntil = m.sent + int64(denied.RetryAfter)
			e.deniedCost = m.costs[m.admitted]
			e.gone = missDenied
		}
	}
	return denied
}

// otherLimits decides reqs[j:] of m, checks of the key under other
// limits than the first's, by one store call each.
func (c *Cache) otherLimits(ctx context.Context, m *missRun) error {
	for k := m.j; k < len(m.reqs); k++ {
		r, err := c.b.Take(ctx, []byte(m.key), m.reqs[k].p, m.reqs[k].cost, time.Unix(0, m.reqs[k].ns), false)
		storeCalls.Inc()
		if err != nil {
			return err
		}
		m.out[k].r = r
	}
	return nil
}

// entry returns key's entry in sh, whose lock the caller holds, creating
// it (and evicting another when the cache is full) or resetting it when
// its limit changed.
func (c *Cache) entry(sh *shard, key string, p algo.Params) *entry {
	e := sh.m[key]
	if e != nil {
		if e.p != p {
			c.orphan(key, e)
			*e = entry{p: p, key: e.key, synced: c.syncN.Load()}
			c.schedule(sh, e, 0)
		}
		return e
	}
	if c.entries.Load() >= int64(c.o.MaxEntries) {
		// The bound holds per shard: a full cache may overshoot it by
		// a key for each shard that holds none.
		c.evictOne(sh)
	}
	e = &entry{p: p, key: key, synced: c.syncN.Load()}
	sh.m[key] = e
	c.schedule(sh, e, 0)
	c.entries.Add(1)
	liveEntries.Add(1)
	return e
}

// evictOne drops one entry of sh, whose lock the caller holds: one
// without a lease if the first few looked at have none, else the first.
func (c *Cache) evictOne(sh *shard) {
	n := 0
	var victim string
	var ve *entry
	for k, e := range sh.m {
		if ve == nil || (ve.lease > 0 && e.lease == 0) {
			victim, ve = k, e
		}
		if n++; n >= 8 || ve.lease == 0 {
			break
		}
	}
	if ve == nil {
		return
	}
	c.orphan(victim, ve)
	ve.due = dead
	delete(sh.m, victim)
	c.entries.Add(-1)
	liveEntries.Add(-1)
	evictions.Inc()
}

// orphan queues the return of e's lease for the next sync, or when it
// has none, the report of what it admitted from its lease (see
// reportOp).
func (c *Cache) orphan(key string, e *entry) {
	var op algo.Op
	switch {
	case e.lease > 0:
		op = c.heldOp(algo.OpRefund, e, e.lease)
		op.TakenAt = e.leaseAt
	case e.spent != 0 && c.o.Holder != "":
		op = c.reportOp(e)
	default:
		return
	}
	op.Key = []byte(key)
	c.orphanMu.Lock()
	c.orphans = append(c.orphans, op)
	c.orphanMu.Unlock()
	e.lease = 0
}

// heldOp returns an op of kind on e's key (set by the caller) with the
// lease accounting: this daemon as the holder, and the units admitted
// from e's lease since its last op, which are then reported. The caller
// holds e's shard lock. An op whose call fails may or may not have
// reported them: they are counted as reported, so that the store
// counts too many units out, never too few.
func (c *Cache) heldOp(kind algo.OpKind, e *entry, n int64) algo.Op {
	op := algo.Op{Kind: kind, Params: e.p, N: n}
	if c.o.Holder != "" {
		op.Holder, op.Spent, op.SpentAt, op.LeaseLife = c.o.Holder, c.takeSpent(e), e.leaseAt, c.leaseLife()
	}
	return op
}

// returnOp returns the op that gives e's whole lease back, and empties
// the lease, gone telling why. The caller holds e's shard lock.
func (c *Cache) returnOp(e *entry, gone missReason) algo.Op {
	op := c.heldOp(algo.OpRefund, e, e.lease)
	op.TakenAt = e.leaseAt
	e.lease, e.gone = 0, gone
	return op
}

// renewWarmOp returns the op that tops e's warm lease up by want units
// and extends its lifetime. The caller holds e's shard lock.
func (c *Cache) renewWarmOp(e *entry, want int64) algo.Op {
	op := c.heldOp(algo.OpLease, e, want)
	op.LeaseLife = c.warmLife()
	return op
}

// lapse drops e's lease with no call, gone telling why: its units are
// lost, and what it admitted is not reported (the store stops counting
// it out when the lease's lifetime or window ends). The caller holds
// e's shard lock.
func lapse(e *entry, gone missReason) {
	leasesLost.Add(int(e.lease))
	e.lease, e.spent, e.gone = 0, 0, gone
}

// reportOp returns the op that reports what e admitted from its lease
// when nothing else will: a peek with the accounting. An entry dropped
// with units spent and unreported would leave them counted out until
// its lease's lifetime ends: quota a reset would leave out of the fresh
// key, and units a refused daemon would recall in vain. The caller
// holds e's shard lock.
func (c *Cache) reportOp(e *entry) algo.Op {
	return c.heldOp(algo.OpPeek, e, 1)
}

// takeSpent returns the units admitted from e's lease not yet reported,
// which the caller's op reports. The caller holds e's shard lock.
func (c *Cache) takeSpent(e *entry) int64 {
	n := e.spent
	e.spent = 0
	return n
}

// leaseLife is how long after a grant the store counts the units as
// out: the lease lapses on the host two sync intervals after the call
// was sent and goes back at the next tick (half an interval); the rest
// is a margin for a loaded host, whose late return would otherwise give
// back nothing (a return gives back no more than is counted out).
func (c *Cache) leaseLife() time.Duration { return 5 * c.o.SyncInterval }

// warmIntervals is the horizon a warm lease is sized for, in sync
// intervals (10 s at the default interval): a lease granted far from the
// key's limit covers that long of the key's local traffic (at least
// warmFloor units), so that a hot key renews it about once per horizon
// rather than every interval, while a lease stays a small part of the
// key's fair share for any key whose limit is far from its traffic.
// Each renewal is a script call that Redis runs while the sync loop
// waits on it: with 100,000 Zipf keys in closed loop, 50 intervals and
// a floor of 64 cost about 600 sync calls/s, 100 and 256 about 170, and
// in two interleaved rounds the p99 on Redis went from 1.22–1.31 ms to
// 0.85–0.92 ms (docs/performance.md, *Fewer renewals*).
const warmIntervals = 100

// warmLifeIntervals is how long a warm lease may be used, in sync
// intervals (5 min at the default interval); it is renewed (its spend
// reported and topped up, in one op) only when it runs low or this
// lifetime nears, and one that was not used since its last op then
// lapses with no call. Long enough that a long-tail key seen once in a
// few minutes is answered locally and costs the store about one call
// per 5 min, not one per check: with 100,000 Zipf keys at 10,000
// checks/s, after a 5 min warm-up, a 30 s life cost the store 0.133
// script calls per check (the keys seen less often than their lease
// lived), 5 min 0.052.
// The price is that a crashed daemon's units (at most its fair share of
// what was left, of a key far from its limit) count as out that long,
// so that a refusal of such a key near its limit recalls them in vain
// and waits RecallWait; and that a lapsed unused lease is lost to the
// bucket until it refills.
const warmLifeIntervals = 3000

// warmFloor is the fewest units a bucket's warm lease (token bucket,
// GCRA) is sized for, under the fair-share cap: a key seen once is
// answered locally at its next few hundred checks. It sizes the leases
// of the long tail, whose smoothed rate is at most a few units per
// interval (warmIntervals of it are fewer), and so how often they are
// renewed: with 100,000 Zipf keys in closed loop, 8 units cost the
// store about 2,000 sync calls/s and 64 about 660 after a 40 s warm-up,
// 1,400 and 850 after 5.5 min (docs/performance.md, *The warm floor*);
// with 256 and warmIntervals of 100, about 170 after 40 s. Units of a
// bucket's lease left unused come back with its refill, and the cap
// still bounds the lease: with 3 daemons a sixth of what is left, so
// that a key gets the whole floor only with 1,536 units or more left.
const warmFloor = 256

// windowFloor is warmFloor for a window's warm lease (fixed window,
// sliding counter), which is sized for the traffic until its window
// ends: units still leased then are lost to the window rather than
// refilled, so the floor stays small.
const windowFloor = 8

// warmLife is the lease lifetime a warm grant tells the store: the
// local lifetime, and the same margin over the local use as leaseLife's (three
// intervals), so that the holder never uses units after the lifetime it
// told the store.
func (c *Cache) warmLife() time.Duration { return (warmLifeIntervals + 3) * c.o.SyncInterval }

// lifeFor returns the lease lifetime of a grant, warm or not.
func (c *Cache) lifeFor(warm bool) time.Duration {
	if warm {
		return c.warmLife()
	}
	return c.leaseLife()
}

// takeLease decides costs for key and leases up to want more units, in
// one store call: with the lease accounting when the cache has a Holder
// (reporting spent units, from the lease taken at spentAt), and then the units the other daemons have
// parked in leases when a cost was refused.
func (c *Cache) takeLease(ctx context.Context, key string, p algo.Params, costs []int64, want, spent, spentAt int64, life time.Duration) (admitted int, leased, parked int64, r algo.Result, err error) {
	if c.o.Holder == "" {
		admitted, leased, r, err = c.b.TakeLease(ctx, []byte(key), p, costs, want)
		return admitted, leased, 0, r, err
	}
	ops := [1]algo.Op{{
		Kind: algo.OpTakeLease, Key: []byte(key), Params: p, N: want, Costs: costs,
		Holder: c.o.Holder, Spent: spent, SpentAt: spentAt, LeaseLife: life,
	}}
	if err := c.b.Sync(ctx, ops[:]); err != nil {
		return 0, 0, 0, algo.Result{}, err
	}
	o := &ops[0]
	if o.Err != nil {
		return 0, 0, 0, algo.Result{}, o.Err
	}
	r = o.Result
	if o.Granted == 0 {
		r.Allowed = o.Admitted == len(costs)
	}
	return o.Admitted, o.Granted, o.Parked, r, nil
}

// unsent puts back into key's entry in sh the spent units, of the lease
// taken at spentAt, that a call that failed with err was to report,
// when err says the call was not sent (a circuit breaker refused it:
// see notSent); they are reported by the key's next op (see mayRespend). Counted as reported instead, they would stay
// counted out at the store with no daemon holding them, for the
// lifetime of the holder's leases of the key (a warm one's: 5 min):
// quota that every refused check of the key would recall in vain. A
// call that may have been run (a timeout) counts as having reported
// them: the store then counts too many units out, never too few. No
// shard lock is held.
func (c *Cache) unsent(sh *shard, key string, p algo.Params, spent, spentAt int64, err error) {
	if spent == 0 || !notSent(err) {
		return
	}
	sh.mu.Lock()
	if e := sh.m[key]; e != nil && e.p == p && mayRespend(e, spentAt) {
		e.spent += spent
	}
	sh.mu.Unlock()
}

// mayRespend reports whether units spent from the lease taken at
// spentAt (store µs) may be reported with e's next op, which reports
// them as of e's lease: a bucket's always, a window's only while e's
// lease is that one (reported against a later window's lease, they
// would take from its units out). The caller holds e's shard lock.
func mayRespend(e *entry, spentAt int64) bool {
	return !windowed(e.p.Kind) || e.leaseAt == spentAt
}

// notSent reports whether a store call's err says that the call was not
// sent: a refusal of a circuit breaker, which tells when the store may
// next be tried (breaker.OpenError's NextTry).
func notSent(err error) bool {
	var nt interface{ NextTry() time.Time }
	return errors.As(err, &nt)
}

// lateWait is how long a take-with-lease whose checks stopped waiting
// (store.timeout) is still waited for, off the key's flight, so that
// the units it leased are given back rather than left out (see
// takeLeaseOrLate): two sync intervals, as long as a sync's own calls
// wait and as long as an ordinary lease is used. With half an interval,
// a loaded two-core host running the burst tests under -race still
// lost a few grants a second (calls answered in up to 80 ms).
func (c *Cache) lateWait() time.Duration { return max(2*c.o.SyncInterval, c.o.Timeout) }

// slowFor is how long after a slow take-with-lease (see
// takeLeaseOrLate) the cache waits for such calls off the key's flight.
const slowFor = 10 * time.Second

// lateCall is a take-with-lease sent by takeLeaseOrLate: its outcome,
// and who handles it, the run that sent it or, once the run stopped
// waiting, the call's own goroutine.
type lateCall struct {
	state    atomic.Int32 // callRunning, then callAnswered or callAbandoned
	done     chan struct{}
	admitted int
	leased   int64
	parked   int64
	r        algo.Result
	err      error
}

// The states of a lateCall.
const (
	callRunning = iota
	callAnswered
	callAbandoned
)

// takeLeaseOrLate is takeLease for a call that asks for a lease (want
// above 0), whose answer is not lost when it comes after ctx ends: the
// checks get ctx's error then, as from takeLease, but the call goes on
// for up to lateWait, and the units its answer leased go back to the
// store at once (giveBackLate). A call that timed out has usually been
// run: without this, its grant was counted out at the store for the
// lease's lifetime (a warm one's: 5 min) with no daemon holding it, so
// that the key's bucket or window lacked those units, and each refused
// check of the key recalled them in vain and waited RecallWait, holding
// the key's flight while the checks behind it timed out.
//
// Waiting off the flight costs a goroutine and its hand-off (about 20
// µs a miss on a loaded two-core host: BenchmarkTakeMiss), so the cache
// does so only while the store is slow: for slowFor after a
// take-with-lease took more than half the timeout or failed. The call
// that shows the store slow is waited for in line and may still lose
// its grant.
func (c *Cache) takeLeaseOrLate(ctx context.Context, key string, p algo.Params, costs []int64, want, spent, spentAt int64, life time.Duration) (admitted int, leased, parked int64, r algo.Result, err error) {
	if want <= 0 {
		return c.takeLease(ctx, key, p, costs, want, spent, spentAt, life)
	}
	start := time.Now()
	if start.UnixNano() >= c.slowUntil.Load() {
		admitted, leased, parked, r, err = c.takeLease(ctx, key, p, costs, want, spent, spentAt, life)
		if err != nil || time.Since(start) > c.o.Timeout/2 {
			c.slowUntil.Store(time.Now().Add(slowFor).UnixNano())
		}
		if err != nil && !notSent(err) {
			c.reclaimLost(key, p, want, spent)
		}
		return admitted, leased, parked, r, err
	}
	lc := &lateCall{done: make(chan struct{})}
	c.running.Add(1) // Close waits for the units to go back
	go func() {
		defer c.running.Add(-1)
		lctx, cancel := context.WithTimeout(context.Background(), c.lateWait())
		defer cancel()
		lc.admitted, lc.leased, lc.parked, lc.r, lc.err = c.takeLease(lctx, key, p, costs, want, spent, spentAt, life)
		if lc.err != nil || time.Since(start) > c.o.Timeout/2 {
			c.slowUntil.Store(time.Now().Add(slowFor).UnixNano())
		}
		if lc.state.CompareAndSwap(callRunning, callAnswered) {
			close(lc.done)
			return
		}
		c.giveBackLate(key, p, lc)
	}()
	select {
	case <-lc.done:
	case <-ctx.Done():
		if lc.state.CompareAndSwap(callRunning, callAbandoned) {
			return 0, 0, 0, algo.Result{}, fmt.Errorf("takelease: %w", ctx.Err())
		}
		<-lc.done // answered as ctx ended
	}
	return lc.admitted, lc.leased, lc.parked, lc.r, lc.err
}

// reclaimLost handles a take-with-lease of key under p, asking for want
// units and reporting spent, that failed in line after it may have run
// (a timeout: the call that shows the store slow, see takeLeaseOrLate).
// Its answer is lost: the store may count up to want units out on this
// daemon's lease that no daemon holds, for the lifetime the call told
// it (a warm grant's: 5 min), and every refusal of the key at its limit
// would recall them in vain, and each lost grant took its units from
// the bucket. So once lateWait has passed (the call has landed or never
// will), the key's lease goes back with want units more and the call's
// spent units reported again: the store gives back no more than it
// counts out for this daemon, so that it then counts none, and the
// units nobody holds are in the bucket again. Until then the key leases
// nothing more (a grant meanwhile would be given back with it: see
// recalledSince). Should the call not have run, its spent units count
// as reported twice: the bucket gets back less than it could, never
// more. A bucket's only: a window's units out lapse with the window. No
// shard lock is held.
func (c *Cache) reclaimLost(key string, p algo.Params, want, spent int64) {
	if c.o.Holder == "" || want <= 0 || windowed(p.Kind) {
		return
	}
	wait := c.lateWait()
	sh := c.shard([]byte(key))
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil || e.p != p {
		sh.mu.Unlock()
		return
	}
	e.noLeaseUntil = max(e.noLeaseUntil, c.o.Clock().UnixNano()+int64(wait)+int64(c.o.SyncInterval))
	sh.mu.Unlock()
	c.running.Add(1) // Close waits for the units to go back
	time.AfterFunc(wait, func() {
		defer c.running.Add(-1)
		sh.mu.Lock()
		var op algo.Op
		switch cur := sh.m[key]; {
		case cur == e && e.p == p:
			op = c.returnOp(e, missReturned)
		case cur != nil:
			// Replaced: the new entry's grants, which the store counts
			// out, must not go back with the reclaim.
			sh.mu.Unlock()
			return
		default:
			// Dropped, holding no lease: nothing of the key is held here.
			op = algo.Op{Kind: algo.OpRefund, Params: p, Holder: c.o.Holder, LeaseLife: c.leaseLife()}
		}
		op.Key, op.N, op.Spent = []byte(key), op.N+want, op.Spent+spent
		sh.mu.Unlock()
		lostReclaimed.Inc()
		c.giveBack(op)
	})
}

// giveBackLate returns the units leased by lc, a take-with-lease that
// answered after its checks stopped waiting (their answers came from
// the rule's fail mode), in one call of its own. The checks it admitted
// stay counted (they may have been admitted locally meanwhile).
func (c *Cache) giveBackLate(key string, p algo.Params, lc *lateCall) {
	lateAnswers.Inc()
	if lc.err != nil || lc.leased <= 0 {
		return
	}
	leasesGranted.Add(int(lc.leased))
	ops := []algo.Op{{Kind: algo.OpRefund, Key: []byte(key), Params: p, N: lc.leased, TakenAt: lc.r.At}}
	if c.o.Holder != "" {
		ops[0].Holder, ops[0].LeaseLife = c.o.Holder, c.leaseLife()
	}
	if err := cmp.Or(c.b.Sync(context.Background(), ops), ops[0].Err); err != nil {
		syncErrors.Inc()
		if notSent(err) {
			// Sent by the next sync (see Cache.keep).
			ops[0].Err = nil
			c.orphanMu.Lock()
			c.orphans = append(c.orphans, ops[0])
			c.orphanMu.Unlock()
			return
		}
		leasesLost.Add(int(lc.leased))
		return
	}
	leasesReturn.Add(int(lc.leased))
	lateReturned.Add(int(lc.leased))
}

// recallPoll is the first wait of a refused take for recalled units;
// each next wait doubles, up to maxRecallPoll.
const (
	recallPoll    = 250 * time.Microsecond
	maxRecallPoll = 4 * time.Millisecond
)

// recall asks the other daemons to return key's parked lease units and
// retries costs[admitted:] until they are admitted, nothing is parked
// any more, or Options.RecallWait has passed. It returns how many costs
// are admitted in all, the last Result, and whether costs were left
// refused with units still parked (the recall or its retries did not
// finish in time). No shard lock is held.
//
// Its calls (the recall's PUBLISH, the retries) have a budget of their
// own, Options.Timeout from the refusal, not what is left of the run's:
// on a loaded host the refused take may have used all of that, and the
// recall was then never sent (a PUBLISH on an ended context fails at
// once) while the units it would have brought back sat parked on the
// other daemons. The run then lasts up to twice the timeout; its checks
// still wait no longer than their own deadlines (see Take), past which
// the rule's fail mode answers them.
func (c *Cache) recall(sh *shard, key string, p algo.Params, costs []int64, admitted int, r algo.Result) (_ int, _ algo.Result, unsettled bool) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	recallsSent.Inc()
	if err := c.o.Recall(ctx, []byte(key), p.Kind); err != nil {
		return admitted, r, true
	}
	wait := recallPoll
	deadline := time.Now().Add(c.o.RecallWait) // the wall clock: a wait, not a decision
	t := time.NewTimer(wait)
	defer t.Stop()
	for admitted < len(costs) && time.Until(deadline) >= wait {
		select {
		case <-ctx.Done():
			return admitted, r, true
		case <-t.C:
		}
		sh.mu.Lock()
		var spent, spentAt int64
		if e := sh.m[key]; e != nil && e.p == p {
			admitted += c.takeOwn(e, costs[admitted:])
			if admitted < len(costs) {
				spent, spentAt = c.takeSpent(e), e.leaseAt
			}
		}
		sh.mu.Unlock()
		if admitted == len(costs) {
			break
		}
		rest := costs[admitted:]
		a, _, parked, r2, err := c.takeLease(ctx, key, p, rest, 0, spent, spentAt, c.leaseLife())
		storeCalls.Inc()
		if err != nil {
			c.unsent(sh, key, p, spent, spentAt, err)
			return admitted, r, true
		}
		admitted, r = admitted+a, r2
		if a < len(rest) && parked == 0 {
			return admitted, r, false // nothing parked any more: a true refusal
		}
		wait = min(2*wait, maxRecallPoll)
		t.Reset(wait)
	}
	if admitted == len(costs) {
		recallsAdmitted.Inc()
		return admitted, r, false
	}
	return admitted, r, true
}

// takeOwn admits costs, in order, from e's own lease while it covers
// them, and returns how many it admitted: units this daemon leased
// while its take waited for a recall (a sync's top-up) count as parked
// at the store, and would be waited for in vain. What they admit is
// counted as spent (the take's next call reports it); the caller counts
// it as used. The caller holds e's shard lock.
func (c *Cache) takeOwn(e *entry, costs []int64) int {
	now := c.o.Clock().UnixNano()
	n := 0
	for n < len(costs) && e.lease >= costs[n] && now < e.leaseUntil {
		e.lease -= costs[n]
		e.spent += costs[n]
		n++
	}
	if n > 0 {
		ownLeaseAdmitted.Add(n)
	}
	return n
}

// applyLease adds leased units, taken at the store's time r.At by a call
// sent at local time sent, to the lease of e, key's entry. A lease of a windowed algorithm
// holds slots of the window of r.At and lapses with it; any lease lapses
// two sync intervals after it was taken unless renewed, a warm one
// (granted with warmLife) warmLifeIntervals after.
func (c *Cache) applyLease(key string, e *entry, leased int64, r algo.Result, sent int64, warm bool) {
	if leased <= 0 {
		return
	}
	until := sent + 2*int64(c.o.SyncInterval)
	if warm {
		until = sent + warmLifeIntervals*int64(c.o.SyncInterval) - c.warmJitter(key, sent)
	}
	inWindow := false
	if windowed(e.p.Kind) {
		per := e.p.PeriodMicros()
		end := r.At - r.At%per + per // the window's end, store µs
		// The call ran at or after sent: mapping the store's time to
		// the local clock through sent errs on the early side.
		end = sent + (end-r.At)*1000 - windowMargin
		inWindow = end <= until
		until = min(until, end)
	}
	if e.lease > 0 && (windowed(e.p.Kind) && e.leaseAt-e.leaseAt%e.p.PeriodMicros() != r.At-r.At%e.p.PeriodMicros()) {
		// The old units belong to a window that has ended: a sliding
		// counter's go back (that window still weighs on its estimate),
		// a fixed window's are lost with it.
		if e.p.Kind.Info().Leases == algo.LeaseWindowReturned && c.o.Holder != "" {
			c.orphan(key, e)
		} else {
			// What the old lease admitted counted against its window's
			// units out, which the store dropped with the window:
			// reported now, it would be taken from the new lease's.
			lapse(e, missWindow)
		}
	}
	e.lease += leased
	e.leaseAt = r.At
	// The store keeps the later of the holder's lifetimes, so that an
	// earlier until here only shortens the local use.
	e.leaseUntil = until
	e.warm, e.inWindow = warm, inWindow
}

// warmJitter returns how much shorter than warmLifeIntervals the local
// lifetime of key's warm lease granted at sent is: up to a tenth of it
// (30 s at the default interval), spread by key and time, so that leases
// granted together (a daemon's first seconds on a long tail of keys)
// come due for renewal or lapse over 600 ticks rather than at one.
// Shorter is safe: the store counts the units out for warmLife whatever
// the local use.
func (c *Cache) warmJitter(key string, sent int64) int64 {
	h := (xxhash.Sum64String(key) ^ uint64(sent)) * 0x9e3779b97f4a7c15
	return int64(h>>1) % (warmLifeIntervals * int64(c.o.SyncInterval) / 10)
}

// windowMargin is how long before its window's end (as mapped to the
// local clock, early) a windowed lease stops being used: a margin for the
// clock's granularity.
const windowMargin = int64(time.Millisecond)

// windowed reports whether k's leases are tied to a window.
func windowed(k algo.Kind) bool {
	return k.Windowed()
}

// leaseWant returns how many units to lease for e beyond need, the cost
// of the checks at hand: about one sync interval of the key's traffic
// (the smoothed rate, or what the key used since the last sync when that
// is more: a key that just became hot doubles its lease each time),
// capped so that all daemons' leases fit in the key's remaining quota
// twice over, and 0 near the limit. A key far over its limit takes its
// whole share of what remains: it will be denied anyway, and it then
// costs the store one call to learn so. A key far from its limit (see
// far) gets a warm lease: warmIntervals of its traffic, at least
// warmFloor units, under the same cap; warm reports so.
func (c *Cache) leaseWant(e *entry, need, ns int64) (want int64, warm bool) {
	if windowed(e.p.Kind) && e.windowEnd > ns && e.windowEnd-ns <= windowMargin {
		return 0, false // the lease would lapse before it could be used
	}
	if ns < e.noLeaseUntil {
		return 0, false // recalled: another daemon needs the key's quota
	}
	want = max(e.rate, e.used, need)
	if windowed(e.p.Kind) && e.windowEnd > ns {
		// Units still leased when the window ends are lost to it: lease
		// only what the time left will use.
		left := e.windowEnd - ns - windowMargin
		want = max(min(want, int64(float64(want)*float64(left)/float64(c.o.SyncInterval))), need)
	}
	peers := c.peers()
	limit := c.remaining(e, ns)
	if c.hammered(e) {
		return max((limit-need)/peers, 0), false
	}
	share := max((limit-need)/(2*peers), 0)
	if c.far(e, limit-need) {
		return min(max(want, c.warmWant(e, e.rate, ns)), share), true
	}
	return min(want, share), false
}

// warmWant returns the size of a warm lease of e at ns for a key using
// rate units per sync interval, before the fair-share cap:
// warmIntervals of its traffic, or of a windowed key's traffic until its
// window ends when that is sooner (units still leased then are lost to
// the window), and at least warmFloor units (windowFloor for a
// window). A window the store has not answered for yet is taken to end
// where the local clock's window does: the store's windows are aligned
// on the epoch too, and this is only a size.
func (c *Cache) warmWant(e *entry, rate, ns int64) int64 {
	intervals, floor := int64(warmIntervals), int64(warmFloor)
	if windowed(e.p.Kind) {
		end := e.windowEnd
		if end <= ns {
			per := int64(e.p.Period)
			end = ns - ns%per + per
		}
		intervals = min(intervals, (end-ns)/int64(c.o.SyncInterval))
		floor = windowFloor
	}
	return max(intervals*rate, floor)
}

// far reports whether e, whose remaining quota at the store is left
// once the checks at hand are taken, is far enough from its limit for a
// warm lease: at least half its capacity left (of its current window,
// for a windowed algorithm) and no denial lately, in a cache that can
// recall leases (a warm lease is not returned when its key goes idle: a
// client that moves to another daemon gets its units by a recall).
func (c *Cache) far(e *entry, left int64) bool {
	return c.o.Holder != "" && c.o.Recall != nil &&
		2*left >= e.p.Capacity() && e.denials == 0 && e.denyRate <= 1
}

// learn records the store's answer r to a call sent at sent.
func (c *Cache) learn(e *entry, r algo.Result, sent int64) {
	e.remaining = r.Remaining
	e.answerAt = sent
	e.resetAt = sent + int64(r.Reset)
	if windowed(e.p.Kind) && r.At > 0 {
		per := e.p.PeriodMicros()
		e.windowEnd = sent + (r.At-r.At%per+per-r.At)*1000
	}
}

// remaining estimates e's remaining quota at the store at ns from the
// last answer: a full limit for a key never asked or whose window has
// ended since, the answer plus the refill since for a bucket.
func (c *Cache) remaining(e *entry, ns int64) int64 {
	capacity := e.p.Capacity()
	switch {
	case e.answerAt == 0:
		return capacity
	case windowed(e.p.Kind):
		if ns >= e.windowEnd {
			return capacity
		}
		return e.remaining
	}
	refill := float64(max(ns-e.answerAt, 0)) * float64(e.p.Limit) / float64(e.p.Period)
	return int64(min(float64(e.remaining)+refill, float64(capacity)))
}

// peers returns the number of live daemons, at least 1.
func (c *Cache) peers() int64 {
	if c.o.Peers == nil {
		return 1
	}
	return int64(max(c.o.Peers(), 1))
}

// minHammered is the fewest denials per sync interval that make a key
// hammered, whatever its limit: a client that retries a few times within
// an interval is not abusing its limit.
const minHammered = 8

// hammered reports whether e is far over its limit: denied more times per
// sync interval than its limit admits in one, and at least minHammered.
func (c *Cache) hammered(e *entry) bool {
	perInterval := max(float64(e.p.Limit)*float64(c.o.SyncInterval)/float64(e.p.Period), minHammered)
	return float64(max(e.denyRate, e.denials)) > perInterval
}

// denialFor returns how long to deny e locally after the store denied it
// with retry-after d; the client is told the same. A key far over its
// limit waits out d, and a bucket's at least until its refill is worth
// one call (see refillHold): it costs the store one call per retry-after
// or per hold, which then leases the refill, rather than one call per
// unit the bucket refills. Any other waits at most one sync interval:
// the denial may be for quota that other daemons hold in leases and
// return at their next sync, and a client within its limit must get it
// then.
func (c *Cache) denialFor(e *entry, d time.Duration) time.Duration {
	if c.hammered(e) {
		return max(d, c.refillHold(e.p))
	}
	return min(d, c.o.SyncInterval)
}

// refillHold is how long a bucket (token bucket, GCRA) far over its
// limit is denied at least: a sync interval per live daemon, so that the
// call at its end takes this daemon's share of the refill, about an
// interval of the key's rate (it admits the check at hand and leases
// the rest: see leaseWant), instead of the one unit that fits after the
// exact retry-after, which the next check's call then finds gone; and
// at most the time half the capacity takes to refill, so that no refill
// is lost to a full bucket while the key waits. The key still gets its
// whole rate, in a batch per hold; only when within the hold is the
// check not exact, and only for a client sending more than twice its
// limit. A window's retry-after already runs to the window's end: 0.
func (c *Cache) refillHold(p algo.Params) time.Duration {
	if windowed(p.Kind) || p.Limit <= 0 {
		return 0
	}
	half := time.Duration(float64(p.Period) * float64(p.Capacity()) / float64(2*p.Limit))
	return min(time.Duration(c.peers())*c.o.SyncInterval, half)
}
