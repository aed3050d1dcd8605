package coalesce

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultMaxBatch is the batch size New uses when Options.MaxBatch is 0
// or less.
const DefaultMaxBatch = 128

// ErrNotRun is wrapped in the error Do returns when it returns without
// having submitted the request to any run: the caller's context ended
// before the request's batch started (or before Do was called). Such a
// request had no effect.
var ErrNotRun = errors.New("coalesce: request not run")

// errGoexit is what the callers of a batch get when run calls
// runtime.Goexit instead of returning.
var errGoexit = errors.New("coalesce: run called runtime.Goexit")

// RunFunc runs one batch for key. reqs holds the batch's requests in
// arrival order, at least one; len(reqs) is the batch size. run must fill
// out[i] with the response to reqs[i] (len(out) == len(reqs), each out[i]
// starts as the zero value), or return an error, which every caller of
// the batch gets instead of a response.
//
// run gets no context: it must bound its own time, since the batch's
// callers and every later caller for key wait for it. run must not keep
// reqs or out after it returns: the Group reuses them. The Group calls run
// for one key at a time, but for different keys concurrently.
type RunFunc[Req, Resp any] func(key string, reqs []Req, out []Resp) error

// Options configures a Group. The zero value is valid.
type Options struct {
	// MaxBatch is the most requests that one batch holds; once full, a
	// batch takes no more and later arrivals start another one, queued
	// behind it. A request removed from its queued batch because its
	// caller's context ended still counts. 0 or less means DefaultMaxBatch.
	MaxBatch int
}

// Stats are a Group's counters, as returned by Group.Stats.
type Stats struct {
	// Batches is the number of runs started since New.
	Batches uint64
	// Requests is the number of requests passed to run since New;
	// Requests/Batches is the mean batch size.
	Requests uint64
	// InFlight is the number of runs in progress now, one at most per key.
	InFlight int
}

// PanicError is the error that the callers of a batch get when run panics.
type PanicError struct {
	// Value is what run passed to panic.
	Value any
	// Stack is the stack trace of the panicking goroutine.
	Stack []byte
}

// Error returns the panic value; it leaves out the stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("coalesce: run panicked: %v", e.Value)
}

// Unwrap returns Value if it is an error, and nil otherwise.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Group batches the calls made through Do, per key. Create it with New;
// the zero Group is not usable. A Group is safe for concurrent use.
type Group[Req, Resp any] struct {
	run      RunFunc[Req, Resp]
	maxBatch int

	mu sync.Mutex
	// m holds the state of every key with a flight in progress, and of
	// no other key. Guarded by mu.
	m map[string]*keyState[Req, Resp]

	batches  atomic.Uint64
	requests atomic.Uint64
	inFlight atomic.Int64

	batchPool sync.Pool // of reset *batch[Req, Resp]
	keyPool   sync.Pool // of *keyState[Req, Resp] with an empty queue
}

// keyState is a key with a flight in progress.
type keyState[Req, Resp any] struct {
	// key is the key, copied from the caller's bytes; it does not change
	// while the state is in Group.m.
	key string
	// queue holds the batches waiting for the flight to end, oldest
	// first; arrivals join the last one until it is full. Guarded by
	// Group.mu.
	queue []*batch[Req, Resp]
}

// batch is one run's worth of requests. While queued it is indexed by
// slot, the order of arrival; when it starts, the requests still wanted are
// compacted, in order, into the run's reqs.
type batch[Req, Resp any] struct {
	// Guarded by Group.mu until started is set; not written afterwards
	// until the batch is reset.
	reqs    []Req   // by slot while queued; the run's requests once started
	pos     []int32 // by slot: -1 if its caller left before the start; once started, the index in out of the slot's response
	live    int     // slots whose callers have not left
	started bool

	out  []Resp        // written by run; read by waiters after done is closed
	err  error         // written by the flight before done is closed
	done chan struct{} // closed when the run has returned; nil for an inline batch
	// refs counts the waiters that have not let go of the batch, plus
	// one for the flight (the queue, then the runner). Whoever drops
	// it to 0 resets the batch and returns it to the pool. Changed under
	// Group.mu while the batch is queued.
	refs atomic.Int32
}

// New returns a Group that runs batches with run. It panics if run is nil.
func New[Req, Resp any](run RunFunc[Req, Resp], o Options) *Group[Req, Resp] {
	if run == nil {
		panic("BUG: coalesce.New: nil run function")
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	g := &Group[Req, Resp]{
		run:      run,
		maxBatch: o.MaxBatch,
		m:        make(map[string]*keyState[Req, Resp]),
	}
	g.batchPool.New = func() any { return new(batch[Req, Resp]) }
	g.keyPool.New = func() any { return new(keyState[Req, Resp]) }
	return g
}

// Do submits req under key and waits for its response, or until ctx ends.
// Do does not keep key: the caller may reuse its bytes once Do returns.
//
// If no flight is in progress for key, Do runs a batch of req alone, in
// the calling goroutine, and returns its result even if ctx ends
// meanwhile. Otherwise req joins the next batch for key. If ctx ends while
// that batch is queued, req is removed from it and Do returns an error
// wrapping both ErrNotRun and ctx.Err(). If ctx ends while the batch is
// running, Do returns at once an error wrapping ctx.Err(): req may have
// been applied, and its response is discarded.
//
// When run returns an error, every caller of the batch gets that error,
// not wrapped; when run panics, each gets a *PanicError.
func (g *Group[Req, Resp]) Do(ctx context.Context, key []byte, req Req) (Resp, error) {
	var zero Resp
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("%w: %w", ErrNotRun, err)
	}

	g.mu.Lock()
	ks := g.m[string(key)]
	if ks == nil {
		ks = g.keyPool.Get().(*keyState[Req, Resp])
		if ks.key != string(key) { // a pooled state often had this key
			ks.key = string(key)
		}
		g.m[ks.key] = ks
		g.mu.Unlock()
		return g.runInline(ks, req)
	}
	b, slot := g.enqueue(ks, req)
	done := b.done
	g.mu.Unlock()

	select {
	case <-done:
		return g.collect(b, slot)
	case <-ctx.Done():
	}

	g.mu.Lock()
	if !b.started {
		b.pos[slot] = -1
		var zreq Req
		b.reqs[slot] = zreq
		b.live--
		b.refs.Add(-1) // not the last: the flight holds one
		g.mu.Unlock()
		return zero, fmt.Errorf("%w: %w", ErrNotRun, ctx.Err())
	}
	g.mu.Unlock()
	select {
	case <-done: // finished as ctx ended: the answer is there
		return g.collect(b, slot)
	default:
	}
	g.release(b)
	return zero, fmt.Errorf("coalesce: stopped waiting for a running batch: %w", ctx.Err())
}

// Stats returns g's counters. It is cheap: a few atomic loads.
func (g *Group[Req, Resp]) Stats() Stats {
	return Stats{
		Batches:  g.batches.Load(),
		Requests: g.requests.Load(),
		InFlight: int(g.inFlight.Load()),
	}
}

// enqueue adds req to the batch that takes arrivals for ks, opening one if
// needed, and returns the batch and req's slot in it. g.mu must be held.
func (g *Group[Req, Resp]) enqueue(ks *keyState[Req, Resp], req Req) (*batch[Req, Resp], int) {
	var b *batch[Req, Resp]
	if n := len(ks.queue); n > 0 && len(ks.queue[n-1].pos) < g.maxBatch {
		b = ks.queue[n-1]
	} else {
		b = g.batchPool.Get().(*batch[Req, Resp])
		b.done = make(chan struct{})
		b.refs.Store(1) // the flight's
		ks.queue = append(ks.queue, b)
	}
	slot := len(b.pos)
	b.reqs = append(b.reqs, req)
	b.pos = append(b.pos, 0)
	b.live++
	b.refs.Add(1)
	return b, slot
}

// collect returns the result for slot of the finished batch b and lets go
// of b.
func (g *Group[Req, Resp]) collect(b *batch[Req, Resp], slot int) (Resp, error) {
	var resp Resp
	err := b.err
	if err == nil {
		resp = b.out[b.pos[slot]]
	}
	g.release(b)
	return resp, err
}

// release drops one reference to b, and pools b if it was the last.
func (g *Group[Req, Resp]) release(b *batch[Req, Resp]) {
	if b.refs.Add(-1) == 0 {
		g.putBatch(b)
	}
}

// runInline runs req alone as the flight for ks, in the caller's goroutine,
// then hands the key's next batch, if any, to a new goroutine.
func (g *Group[Req, Resp]) runInline(ks *keyState[Req, Resp], req Req) (Resp, error) {
	b := g.batchPool.Get().(*batch[Req, Resp])
	b.reqs = append(b.reqs, req)
	b.pos = append(b.pos, 0)
	b.live = 1
	b.start()
	g.exec(ks, b)
	resp, err := b.out[0], b.err
	if next := g.next(ks); next != nil {
		go g.loop(ks, next)
	}
	g.putBatch(b)
	if err != nil {
		var zero Resp
		return zero, err
	}
	return resp, nil
}

// loop runs b, then the batches queued behind it, until ks has none left.
func (g *Group[Req, Resp]) loop(ks *keyState[Req, Resp], b *batch[Req, Resp]) {
	for b != nil {
		g.exec(ks, b)
		close(b.done)
		g.release(b)
		b = g.next(ks)
	}
}

// next ends the flight for ks: it dequeues and starts the next batch that
// still has requests, and returns it for the caller to run; if there is
// none, it deletes ks and returns nil.
func (g *Group[Req, Resp]) next(ks *keyState[Req, Resp]) *batch[Req, Resp] {
	g.mu.Lock()
	for len(ks.queue) > 0 {
		b := ks.queue[0]
		n := copy(ks.queue, ks.queue[1:])
		ks.queue[n] = nil
		ks.queue = ks.queue[:n]
		if b.live > 0 {
			b.start()
			g.mu.Unlock()
			return b
		}
		// Every caller left; only the flight's reference remains.
		g.putBatch(b)
	}
	delete(g.m, ks.key)
	g.mu.Unlock()
	g.keyPool.Put(ks)
	return nil
}

// exec calls run for b, turning a panic into b.err. If run calls
// runtime.Goexit, exec ends b with an error and hands the key's next batch
// to a new goroutine before the calling goroutine ends.
func (g *Group[Req, Resp]) exec(ks *keyState[Req, Resp], b *batch[Req, Resp]) {
	g.batches.Add(1)
	g.requests.Add(uint64(len(b.reqs)))
	g.inFlight.Add(1)
	returned := false
	defer func() {
		g.inFlight.Add(-1)
		if returned {
			return
		}
		if r := recover(); r != nil {
			b.err = &PanicError{Value: r, Stack: debug.Stack()}
			return
		}
		// runtime.Goexit: nothing after exec runs in this goroutine.
		b.err = errGoexit
		if b.done != nil {
			close(b.done)
		}
		if next := g.next(ks); next != nil {
			go g.loop(ks, next)
		}
	}()
	b.err = g.run(ks.key, b.reqs, b.out)
	returned = true
}

// start marks b started and compacts its remaining requests into run
// order, noting where each slot's response will be. g.mu must be held for
// a queued batch.
func (b *batch[Req, Resp]) start() {
	b.started = true
	n := 0
	for s, p := range b.pos {
		if p < 0 {
			continue
		}
		b.reqs[n] = b.reqs[s]
		b.pos[s] = int32(n)
		n++
	}
	clear(b.reqs[n:])
	b.reqs = b.reqs[:n]
	b.out = slices.Grow(b.out[:0], n)[:n] // zero: putBatch clears what it used
}

// putBatch resets b, which nobody else holds, and returns it to the pool.
func (g *Group[Req, Resp]) putBatch(b *batch[Req, Resp]) {
	clear(b.reqs)
	clear(b.out)
	b.reqs = b.reqs[:0]
	b.out = b.out[:0]
	b.pos = b.pos[:0]
	b.live = 0
	b.started = false
	b.err = nil
	b.done = nil
	b.refs.Store(0)
	g.batchPool.Put(b)
}
