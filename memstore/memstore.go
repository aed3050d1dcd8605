// Package memstore is rld's embedded in-memory Store for a single host.
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/algo"
)

// Defaults for Options and Run.
const (
	// DefaultMaxKeys holds the store to about 40 MB of memory: a token
	// bucket's key takes about 192 bytes of heap (BenchmarkBytesPerKey),
	// twice that in the process's resident memory.
	DefaultMaxKeys       = 100_000
	DefaultShards        = 256
	DefaultSweepInterval = 10 * time.Second
)

const (
	// maxShards caps Options.Shards.
	maxShards = 1 << 16
	// idleScan is how many entries at the cold end of a full shard are
	// searched for an idle one before the least recently used is evicted.
	idleScan = 8
)

var (
	// liveKeys is the number of keys held by all Stores.
	liveKeys atomic.Int64

	_         = metrics.NewGauge(`rld_store_keys`, func() float64 { return float64(liveKeys.Load()) })
	evictions = metrics.NewCounter(`rld_store_evictions_total`)
	swept     = metrics.NewCounter(`rld_store_swept_total`)
)

// Options configures a Store.
type Options struct {
	// MaxKeys bounds the keys held. Once the store holds MaxKeys keys (or
	// one shard holds twice its fair share), a new key makes its shard
	// drop an idle key if it finds one among its least recently used, and
	// evict its least recently used key otherwise. Concurrent inserts may
	// overshoot MaxKeys by a few keys. Zero or less means DefaultMaxKeys.
	MaxKeys int
	// Shards is the number of lock stripes, rounded up to a power of two
	// and lowered until each holds at least 64 keys' fair share. Zero or
	// less means DefaultShards.
	Shards int
}

// Store holds the algorithm state of every counter key in memory. It
// implements policy.Store. It is safe for concurrent use; the zero Store is
// not: use New.
type Store struct {
	// seed keys the hash of every key. A random seed per Store keeps
	// clients, who choose the descriptors, from choosing keys that share
	// a shard or a hash.
	seed     maphash.Seed
	shards   []shard
	mask     uint64 // len(shards)−1
	maxKeys  int64  // the store evicts once it holds this many keys
	perShard int    // the most entries one shard holds: twice its fair share
	keys     atomic.Int64
}

type shard struct {
	mu sync.Mutex // guards m, n, lru and the entries in them
	// m indexes the entries by their key's (seeded) hash, which also
	// picked the shard: a key is hashed once. Keys whose hashes collide
	// share a chain through entry.same.
	m   map[uint64]*entry
	n   int // entries held
	lru list
	// op is the Op of Take, which sets its Kind, Params and N (the only
	// fields algo.Apply reads for a take or a peek), and of TakeSlot,
	// whose Slots is slot.
	op   algo.Op
	slot [1]uint64
	_    [64]byte // keeps the next shard's mu off this shard's cache lines
}

// entry is one key's state, linked into its shard's LRU list.
type entry struct {
	key        string
	hash       uint64 // the Store's hash of key
	same       *entry // the next entry whose key has the same hash
	prev, next *entry
	// idleAt is the unix µs from which st is idle (algo.Idle): the time
	// plus Result.Reset of the last take that changed st. Refunds only
	// make a state idle sooner, so it stays a safe bound after them.
	idleAt int64
	kind   algo.Kind // the algorithm st belongs to
	st     algo.State
}

// New returns an empty Store configured by o.
func New(o Options) *Store {
	if o.MaxKeys <= 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.Shards <= 0 {
		o.Shards = DefaultShards
	}
	n := 1 << bits.Len(uint(min(o.Shards, maxShards)-1))
	// Few keys, few shards: each shard's fair share stays large enough
	// that uneven hashing does not fill one shard early.
	for n > 1 && n*minFairShare > o.MaxKeys {
		n /= 2
	}
	s := &Store{
		seed:     maphash.MakeSeed(),
		shards:   make([]shard, n),
		mask:     uint64(n - 1),
		maxKeys:  int64(o.MaxKeys),
		perShard: 2 * ((o.MaxKeys + n - 1) / n),
	}
	for i := range s.shards {
		s.shards[i].m = make(map[uint64]*entry)
		s.shards[i].lru.init()
	}
	return s
}

// shard returns the shard of key and key's hash.
func (s *Store) shard(key []byte) (*shard, uint64) {
	h := maphash.Bytes(s.seed, key)
	return &s.shards[h&s.mask], h
}

// get returns the entry of key, whose hash is h, or nil.
func (sh *shard) get(key []byte, h uint64) *entry {
	e := sh.m[h]
	for e != nil && e.key != string(key) {
		e = e.same
	}
	return e
}

// Take decides whether cost units of the limit p are available for key at
// now and consumes them when they are and peek is false; see algo.Decide.
// A cost of 0 or less counts as 1. A peek, or a denial, on a key that the
// Store does not hold creates nothing. A key last used with another
// algorithm starts fresh. Take fails only when p is invalid; it does not
// block, so ctx is not consulted. It does not allocate for a key it holds.
func (s *Store) Take(_ context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	if err := checkParams(p); err != nil {
		return algo.Result{}, err
	}
	kind := algo.OpTake
	if peek {
		kind = algo.OpPeek
	}
	us := now.UnixMicro()
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	// The shard's op: building a whole Op on the stack for each check
	// costs more than the decision.
	op := &sh.op
	op.Kind, op.Params, op.N = kind, p, max(cost, 1)
	s.applyLocked(sh, key, h, op, us)
	return op.Result, nil
}

// TakeSlot acquires one slot of the Concurrency limit p for key at now,
// named slot (non-zero, unique: the caller's to make so), as an
// algo.OpAcquire of that one id; see algo.Acquire. The Result's At is the
// slot's time, which with slot names it for its release (an OpRelease
// through Do). It fails only when p is invalid or not a Concurrency
// limit; it does not block, and does not allocate for a key it holds.
func (s *Store) TakeSlot(_ context.Context, key []byte, p algo.Params, slot uint64, now time.Time) (algo.Result, error) {
	if err := checkParams(p); err != nil {
		return algo.Result{}, err
	}
	if !p.Kind.Info().Slots {
		return algo.Result{}, fmt.Errorf("memstore: acquire %q: a slot of a %s limit: want one of slots", key, p.Kind)
	}
	us := now.UnixMicro()
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	op := &sh.op
	sh.slot[0] = slot
	op.Kind, op.Params, op.Slots = algo.OpAcquire, p, sh.slot[:]
	s.applyLocked(sh, key, h, op, us)
	op.Slots = nil
	return op.Result, nil
}

// Do runs each op on its key at now with algo.Apply, as Take and Refund
// do, setting each op's outcomes: Admitted, Granted, Result, and Err for
// an op whose Params are invalid or that algo.Op.Check rejects (it
// changes nothing). An op that clears the key's state (OpReset, see
// algo.OpInfo) drops the key, an OpGrant of a key the Store does
// not hold (or holds for another algorithm) finds a fresh key's quota
// and changes nothing. Do does not block; ctx is not consulted. It
// returns nil: the errors are the ops'.
func (s *Store) Do(_ context.Context, ops []algo.Op, now time.Time) error {
	us := now.UnixMicro()
	for i := range ops {
		op := &ops[i]
		op.Admitted, op.Granted, op.Result, op.Err = 0, 0, algo.Result{}, nil
		if err := checkParams(op.Params); err != nil {
			op.Err = fmt.Errorf("memstore: %s %q: %w", op.Kind, op.Key, err)
			continue
		}
		if err := op.Check(); err != nil {
			op.Err = fmt.Errorf("memstore: %s %q: %w", op.Kind, op.Key, err)
			continue
		}
		s.apply(op.Key, op, us)
	}
	return nil
}

// apply runs op on key's state at us with algo.Apply, the one
// implementation of every op: a key the Store does not hold is a fresh
// one, and is inserted only when the op consumed some of it; a key held
// for another algorithm is fresh too, and is replaced only when the op
// writes (a take, a lease). op.Params must be valid.
func (s *Store) apply(key []byte, op *algo.Op, us int64) {
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s.applyLocked(sh, key, h, op, us)
}

// applyLocked is apply with sh, key's shard (h: key's hash), locked.
func (s *Store) applyLocked(sh *shard, key []byte, h uint64, op *algo.Op, us int64) {
	e := sh.get(key, h)
	in := op.Kind.Info()
	if in.Clears && e != nil {
		sh.remove(e)
		s.keys.Add(-1)
		liveKeys.Add(-1)
		e = nil
	}
	if e != nil && e.kind != op.Params.Kind && !in.Consumes {
		e = nil
	}
	if e == nil {
		var st algo.State
		algo.Apply(op, &st, us)
		if consumed(op) {
			s.insert(sh, key, h, op.Params.Kind, st, us+op.Result.Reset.Microseconds(), us)
		}
		return
	}
	sh.lru.moveToFront(e)
	if e.kind != op.Params.Kind {
		e.kind, e.st, e.idleAt = op.Params.Kind, algo.State{}, us
	}
	if n := len(e.st.Log); n > 0 && e.st.Log[n-1].At > us {
		// A log's admissions are named by their time (a concurrency
		// lease's id, a refund's takenAt), and one made before the
		// newest entry's time would join that entry under another
		// name: a key's clock never steps back, as Redis TIME does
		// not, however the callers' times interleave.
		us = e.st.Log[n-1].At
	}
	algo.Apply(op, &e.st, us)
	if consumed(op) {
		// Refunds and grants only make a state idle sooner.
		e.idleAt = us + op.Result.Reset.Microseconds()
	}
}

// consumed reports whether op, which Apply ran, admitted any unit: a
// take allowed, units admitted or granted, or any op that consumes
// whether or not it fits (a charge).
func consumed(op *algo.Op) bool {
	in := op.Kind.Info()
	switch {
	case !in.Consumes:
		return false
	case in.Take || in.Lease:
		return op.Result.Allowed || op.Admitted > 0 || op.Granted > 0
	}
	return true
}

// checkParams rejects the Params that would make the algorithms divide by
// zero or run past their exact range. Callers are expected to pass Params
// that passed Params.Validate (policy does, when it compiles the rules);
// this is the cheap guard that keeps a bad caller from crashing the daemon.
func checkParams(p algo.Params) error {
	if p.Limit <= 0 || p.Period < time.Microsecond || p.Burst < 0 || p.Kind >= algo.NumKinds {
		return fmt.Errorf("memstore: invalid limit %+v", p)
	}
	return nil
}

// Refund gives back cost units that Take admitted for key at takenAt; see
// algo.Refund. A cost of 0 or less counts as 1. A key the Store no longer
// holds, or holds for another algorithm, has nothing to give back. Refund
// fails only when p is invalid.
func (s *Store) Refund(_ context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	if err := checkParams(p); err != nil {
		return err
	}
	op := algo.Op{Kind: algo.OpRefund, Params: p, N: max(cost, 1), TakenAt: takenAt.UnixMicro()}
	s.apply(key, &op, now.UnixMicro())
	return nil
}

// minFairShare is the fewest keys per shard that New aims for.
const minFairShare = 64

// insert adds key, whose hash is h, with state st to sh, whose lock the
// caller holds, making room first if sh is full. The chain of h is read
// after the victim has left it, since the victim may share h.
func (s *Store) insert(sh *shard, key []byte, h uint64, kind algo.Kind, st algo.State, idleAt, now int64) {
	var e *entry
	if sh.n > 0 && (s.keys.Load() >= s.maxKeys || sh.n >= s.perShard) {
		e = sh.victim(now) // reused: the count of keys stays
	} else {
		e = new(entry)
		s.keys.Add(1)
		liveKeys.Add(1)
	}
	*e = entry{key: string(key), hash: h, same: sh.m[h], idleAt: idleAt, kind: kind, st: st}
	sh.m[h] = e
	sh.n++
	sh.lru.pushFront(e)
}

// victim removes and returns an entry of the full shard sh: an idle one
// among the least recently used if there is one, the least recently used
// otherwise.
func (sh *shard) victim(now int64) *entry {
	for i, e := 0, sh.lru.back(); i < idleScan && e != nil; i, e = i+1, sh.lru.prev(e) {
		if e.idleAt <= now {
			sh.remove(e)
			swept.Inc()
			return e
		}
	}
	e := sh.lru.back()
	if e == nil {
		panic("BUG: memstore: full shard with no entries")
	}
	sh.remove(e)
	evictions.Inc()
	return e
}

// remove unlinks e from sh, whose lock the caller holds.
func (sh *shard) remove(e *entry) {
	switch first := sh.m[e.hash]; {
	case first == e && e.same == nil:
		delete(sh.m, e.hash)
	case first == e:
		sh.m[e.hash] = e.same
	default:
		for first.same != e {
			first = first.same
		}
		first.same = e.same
	}
	e.same = nil
	sh.n--
	sh.lru.remove(e)
}

// Has reports whether the Store holds state for key.
func (s *Store) Has(key []byte) bool {
	sh, h := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.get(key, h) != nil
}

// Len returns the number of keys the Store holds.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Sweep deletes the keys whose state is idle at now (equivalent to a fresh
// key's) and returns how many it deleted. It locks one shard at a time.
func (s *Store) Sweep(now time.Time) int {
	us := now.UnixMicro()
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for e := sh.lru.back(); e != nil; {
			prev := sh.lru.prev(e)
			if e.idleAt <= us {
				sh.remove(e)
				n++
			}
			e = prev
		}
		sh.mu.Unlock()
	}
	s.keys.Add(int64(-n))
	liveKeys.Add(int64(-n))
	swept.Add(n)
	return n
}

// Run calls Sweep(time.Now()) every interval (DefaultSweepInterval if
// every is 0 or less) until ctx is done.
func (s *Store) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultSweepInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Sweep(time.Now())
		}
	}
}
