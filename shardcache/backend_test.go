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
// decisions on one map under one lock, timed by the wall clock. The Redis
// scripts compute the same (the lua package's differential test), so the
// cache's logic can be tested here for every interleaving the race
// detector explores; the daemon's tests run it against real Redis.
type algoBackend struct {
	mu     sync.Mutex
	states map[string]*algo.State
	// admitted counts the units admitted per key, leases included, minus
	// those returned.
	calls    atomic.Int64 // TakeLease and Take calls
	syncs    atomic.Int64 // Sync calls
	syncOps  atomic.Int64
	now      func() int64 // store µs; nil: the wall clock
	failNext atomic.Bool
}

func newAlgoBackend() *algoBackend {
	return &algoBackend{states: map[string]*algo.State{}}
}

func (b *algoBackend) clock() int64 {
	if b.now != nil {
		return b.now()
	}
	return time.Now().UnixMicro()
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

func (b *algoBackend) Sync(_ context.Context, ops []shardcache.Op) error {
	b.syncs.Add(1)
	b.syncOps.Add(int64(len(ops)))
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock()
	for i := range ops {
		op := &ops[i]
		s := b.state(op.Key, op.Params)
		switch op.Kind {
		case shardcache.OpPeek:
			op.Result = algo.Decide(op.Params, s, now, op.N, true)
		case shardcache.OpLease:
			op.Granted, op.Result = algo.Lease(op.Params, s, now, op.N)
		case shardcache.OpReturn:
			algo.Refund(op.Params, s, now, op.TakenAt, op.N)
			op.Result = algo.Decide(op.Params, s, now, 1, true)
		}
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
