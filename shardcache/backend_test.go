package shardcache_test

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// algoBackend is a shared store in this process: package algo's exact
// decisions on one map under one lock, timed by the test's fake clock. The Redis
// scripts compute the same (the lua package's differential test), so the
// cache's logic can be tested here for every interleaving the race
// detector explores; the daemon's tests run it against real Redis.
type algoBackend struct {
	mu     sync.Mutex
	states map[string]*algo.State
	// admitted counts the units admitted per key, leases included, minus
	// those returned.
	calls   atomic.Int64 // TakeLease and Take calls
	syncs   atomic.Int64 // Sync calls
	syncOps atomic.Int64
	// maxSyncOps is the most ops one Sync call carried.
	maxSyncOps atomic.Int64
	clk        *fakeClock // the store's time, and its caches'
	failNext   atomic.Bool
}

func newAlgoBackend() *algoBackend {
	return &algoBackend{states: map[string]*algo.State{}, clk: newFakeClock()}
}

func (b *algoBackend) clock() int64 { return b.clk.Now().UnixMicro() }

// newCache returns a Cache in front of b on b's clock.
func newCache(b shardcache.Backend, clk *fakeClock, o shardcache.Options) *shardcache.Cache {
	o.Clock = clk.Now
	return shardcache.New(b, o)
}

// fakeClock is the time of a test's store and caches: it moves only when
// the test moves it, so that no outcome depends on the machine's speed.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := new(fakeClock)
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

// Now returns the fake time.
func (c *fakeClock) Now() time.Time { return time.Unix(0, c.ns.Load()) }

// set moves the clock to t.
func (c *fakeClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }

// loops runs caches' sync loops on a fake clock, as Cache.Run does on the
// wall clock: every half sync interval, ReturnIdle and Sync in turn. One
// goroutine drives it.
type loops struct {
	clk    *fakeClock
	caches []*shardcache.Cache
	half   time.Duration
	next   time.Time // the next tick
	n      int       // ticks run
}

func newLoops(clk *fakeClock, interval time.Duration, caches ...*shardcache.Cache) *loops {
	return &loops{clk: clk, caches: caches, half: interval / 2, next: clk.Now().Add(interval / 2)}
}

// advance moves the clock d on, running every tick due on the way at its
// time, and returns the new time.
func (l *loops) advance(d time.Duration) time.Time {
	end := l.clk.Now().Add(d)
	for !l.next.After(end) {
		l.clk.set(l.next)
		for _, c := range l.caches {
			if l.n%2 == 0 {
				c.ReturnIdle(l.next)
			} else {
				c.Sync(l.next)
			}
		}
		l.n++
		l.next = l.next.Add(l.half)
	}
	l.clk.set(end)
	return end
}

func (b *algoBackend) state(key []byte, p algo.Params) *algo.State {
	k := string(key) + "/" + p.Kind.String()
	s := b.states[k]
	if s == nil {
		s = new(algo.State)
		b.states[k] = s
	}
	return s
}

var errInjected = context.DeadlineExceeded

func (b *algoBackend) Take(_ context.Context, key []byte, p algo.Params, cost int64, _ time.Time, peek bool) (algo.Result, error) {
	b.calls.Add(1)
	if b.failNext.Swap(false) {
		return algo.Result{}, errInjected
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return algo.Decide(p, b.state(key, p), b.clock(), cost, peek), nil
}

func (b *algoBackend) Refund(_ context.Context, key []byte, p algo.Params, cost int64, takenAt, _ time.Time) error {
	b.calls.Add(1)
	b.mu.Lock()
	defer b.mu.Unlock()
	algo.Refund(p, b.state(key, p), b.clock(), takenAt.UnixMicro(), cost)
	return nil
}

func (b *algoBackend) TakeLease(_ context.Context, key []byte, p algo.Params, costs []int64, want int64) (int, int64, algo.Result, error) {
	b.calls.Add(1)
	if b.failNext.Swap(false) {
		return 0, 0, algo.Result{}, errInjected
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n, g, r := algo.TakeLease(p, b.state(key, p), b.clock(), costs, want)
	return n, g, r, nil
}

func (b *algoBackend) Sync(_ context.Context, ops []algo.Op) error {
	b.syncs.Add(1)
	b.syncOps.Add(int64(len(ops)))
	for n := int64(len(ops)); ; {
		m := b.maxSyncOps.Load()
		if n <= m || b.maxSyncOps.CompareAndSwap(m, n) {
			break
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock()
	for i := range ops {
		algo.Apply(&ops[i], b.state(ops[i].Key, ops[i].Params), now)
	}
	return nil
}

// remaining returns the units key has left at the store.
func (b *algoBackend) remaining(key string, p algo.Params) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := algo.Decide(p, b.state([]byte(key), p), b.clock(), 1, true)
	if !r.Allowed {
		return 0
	}
	return r.Remaining + 1 // a peek's Remaining is after its cost of 1
}
