package policy

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
)

// LocalStore is the store a Fallback keeps its local state in, private
// to this daemon: the embedded store (package memstore) in the daemon.
type LocalStore interface {
	Store
	Operator
	SlotTaker
	// Sweep drops the state of every key idle at now and returns how
	// many it dropped.
	Sweep(now time.Time) int
	// Has reports whether the store holds state for key.
	Has(key []byte) bool
}

// Health is what a Policy learns of the shared store's fleet and circuit
// breakers, without depending on them: the daemon's Redis fleet
// implements it. Its methods are called only when a store call failed,
// and must be safe for concurrent use.
type Health interface {
	// Peers returns how many daemons share the store, this one included:
	// the count of the last heartbeat that reached the store (so the
	// last one known during an outage), 1 when never known.
	Peers() int
	// RetryAt returns when the store may next be tried: the earliest
	// next probe of a circuit breaker that is not closed (in the past
	// while one is half-open), or the zero time when none says.
	RetryAt() time.Time
}

// Defaults of FallbackOptions.
const (
	// DefaultFallbackForget is how long the local state of fail-open
	// rules outlives its last use.
	DefaultFallbackForget = time.Second
	// DefaultClosedRetry is the retry-after of a fail-closed denial when
	// neither the error, the Health nor a Timeout says when to retry.
	DefaultClosedRetry = time.Second
)

// FallbackOptions configures a Fallback. The zero value of each field
// means its default.
type FallbackOptions struct {
	// Health gives the live daemons and the breakers' next probe. Nil
	// means one daemon and no breaker.
	Health Health
	// NewLocal returns a fresh, empty LocalStore for the local state of
	// an outage; it must be set. The daemon's builds a memstore bounded
	// by store.max_keys.
	NewLocal func() LocalStore
	// Timeout is the store's call timeout: the retry-after of a
	// fail-closed denial when no breaker says when to retry
	// (DefaultClosedRetry when 0).
	Timeout time.Duration
	// Forget is how long the local state outlives its last use
	// (DefaultFallbackForget): once no check has needed it for that
	// long, the store has answered every check meanwhile, and the next
	// outage starts from fresh local state.
	Forget time.Duration
	// Seed, when set, returns what this daemon last knew at now of a
	// key's remaining quota in the store under limit p (ok false when
	// it knows nothing): the hot-key cache's view (shardcache's Known),
	// which holds the last answers to cached and strict rules alike.
	// A key's local state then starts from its share of that, not from a
	// full share, so that an outage does not hand out quota the fleet
	// had already spent. It must be safe for concurrent use.
	Seed func(key []byte, p algo.Params, now time.Time) (remaining int64, ok bool)
	// Clock tells the time for Active (nil: time.Now); checks and Sweep
	// take theirs as an argument.
	Clock func() time.Time
}

// Fallback decides the checks of rules whose store failed (an error, a
// timeout, an open circuit breaker), as each rule's fail mode says:
//
//   - fail = "open": on local state alone, in an embedded store (package
//     memstore) private to this daemon, at this daemon's fair share of
//     the limit: Limit and Burst divided by Health.Peers(), each at least
//     1. The fleet as a whole then admits about the limit, not the limit
//     times the number of daemons. A key's local state starts from this
//     daemon's share of what it last knew of the key's remaining quota
//     (FallbackOptions.Seed), so a key the fleet was refusing stays
//     refused until its share refills. Answers are allowed-degraded, or
//     limited and degraded.
//   - fail = "closed": denied and degraded, with a retry-after of the
//     time until the store's next probe (at least 1 ms).
//
// Nothing the local state admits is ever charged to the store: when the
// store answers again, the rule is decided there at once, and the local
// state, no longer used, is dropped after FallbackOptions.Forget (at the
// next use after that, or by Sweep). The Policies of one daemon share its
// Fallback, so that a reload during an outage keeps the local state.
//
// Create a Fallback with NewFallback; it is safe for concurrent use.
type Fallback struct {
	o       FallbackOptions
	seedMu  sync.Mutex // serialises seeding a key's local state
	mu      sync.Mutex // serialises replacing mem
	mem     atomic.Pointer[localState]
	lastUse atomic.Int64 // unix ns of the last use of mem
	// lastClosed is the unix ns of the last check a fail-closed rule
	// refused because its store failed.
	lastClosed atomic.Int64
}

// localState holds the LocalStore in use, so that it can be swapped
// atomically.
type localState struct{ LocalStore }

// NewFallback returns a Fallback with options o, whose NewLocal must be
// set.
func NewFallback(o FallbackOptions) *Fallback {
	if o.NewLocal == nil {
		panic("policy: FallbackOptions.NewLocal is nil")
	}
	if o.Forget <= 0 {
		o.Forget = DefaultFallbackForget
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return &Fallback{o: o}
}

// local returns the local store for a check at now, a fresh one when the
// last one has not been used for Forget (its state is from an earlier
// outage).
func (f *Fallback) local(now time.Time) *localState {
	ns := now.UnixNano()
	m := f.mem.Load()
	if m == nil || ns-f.lastUse.Load() > int64(f.o.Forget) {
		f.mu.Lock()
		if m = f.mem.Load(); m == nil || ns-f.lastUse.Load() > int64(f.o.Forget) {
			old := m
			m = &localState{f.o.NewLocal()}
			f.mem.Store(m)
			drop(old)
		}
		f.lastUse.Store(ns)
		f.mu.Unlock()
	}
	if last := f.lastUse.Load(); ns > last {
		f.lastUse.CompareAndSwap(last, ns) // a lost race is a use as recent
	}
	return m
}

// forever is a time after every key's state is idle: sweeping a store at
// it empties the store.
var forever = time.Unix(1<<40, 0)

// drop empties m, if not nil, so that the gauge of keys held counts its
// keys out.
func drop(m *localState) {
	if m != nil {
		m.Sweep(forever)
	}
}

// Sweep drops the local state when no check has used it for Forget, and
// reports whether it did. The daemon calls it now and then, so that the
// memory of an outage is given back when it is over.
func (f *Fallback) Sweep(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.mem.Load()
	if m == nil || now.UnixNano()-f.lastUse.Load() <= int64(f.o.Forget) {
		return false
	}
	f.mem.Store(nil)
	drop(m)
	return true
}

// Active reports whether fail modes decide checks: some check used the
// Fallback's local state (a fail-open rule), or a fail-closed rule refused
// one because its store failed, within Forget.
func (f *Fallback) Active() bool {
	ns := f.o.Clock().UnixNano()
	return f.mem.Load() != nil && ns-f.lastUse.Load() <= int64(f.o.Forget) ||
		ns-f.lastClosed.Load() <= int64(f.o.Forget)
}

// Peers returns the live daemons as the Health says, at least 1.
func (f *Fallback) Peers() int {
	if f.o.Health == nil {
		return 1
	}
	return max(f.o.Health.Peers(), 1)
}

// decide answers a check of a rule with fail mode fail (limit p, counter
// key key) whose store failed with err. A cost above p's capacity gets
// RetryAfter algo.Never, as from a store. A slot (non-zero) is an
// acquire's, held by that id in the local state.
func (f *Fallback) decide(fail config.Fail, p *algo.Params, key []byte, cost int64, slot uint64, now time.Time, peek bool, err error) (algo.Result, error) {
	if cost > p.Capacity() {
		// Never admitted, whatever the store says: answered as usual.
		return algo.Result{Limit: p.Capacity(), RetryAfter: algo.Never}, nil
	}
	if fail == config.FailClosed {
		if ns := now.UnixNano(); ns > f.lastClosed.Load() {
			f.lastClosed.Store(ns) // a lost race is a refusal as recent
		}
		return algo.Result{Limit: p.Capacity(), RetryAfter: f.retryAfter(err, now)}, nil
	}
	peers := f.Peers()
	share := fairShare(*p, peers)
	m := f.local(now)
	if f.o.Seed != nil && !m.Has(key) {
		f.seed(m, key, p, share, peers, now)
	}
	var res algo.Result
	var lerr error
	if slot != 0 {
		res, lerr = m.TakeSlot(context.Background(), key, share, slot, now)
	} else {
		res, lerr = m.Take(context.Background(), key, share, cost, now, peek)
	}
	if lerr != nil {
		return algo.Result{}, lerr
	}
	if !res.Allowed && res.RetryAfter == algo.Never {
		// The cost fits the limit but not this daemon's share of it:
		// denied while the store is out, not for ever.
		res.RetryAfter = p.Period
	}
	return res, nil
}

// seed starts key's local state in m, which does not hold it, from what
// the daemon last knew of the key in the store (FallbackOptions.Seed):
// this daemon's share of the remaining quota, the rest of the share taken
// at now. A key it knows nothing of starts from a full share.
func (f *Fallback) seed(m LocalStore, key []byte, p *algo.Params, share algo.Params, peers int, now time.Time) {
	f.seedMu.Lock()
	defer f.seedMu.Unlock()
	if m.Has(key) {
		return // seeded by a concurrent check
	}
	remaining, ok := f.o.Seed(key, *p, now)
	if !ok {
		return
	}
	capacity := share.Capacity()
	left := min(max(remaining, 0)/int64(peers), capacity)
	if spent := capacity - left; spent > 0 {
		_, _ = m.Take(context.Background(), key, share, spent, now, false)
		fallbackSeeded.Inc()
	}
}

// refund gives back to the local state cost units it admitted for key.
func (f *Fallback) refund(key []byte, p *algo.Params, cost int64, takenAt, now time.Time) {
	if m := f.mem.Load(); m != nil {
		_ = m.Refund(context.Background(), key, fairShare(*p, f.Peers()), cost, takenAt, now)
	}
}

// nextTrier is implemented by store errors that say when the store may
// next be tried: a *breaker.OpenError, which redisx returns.
type nextTrier interface{ NextTry() time.Time }

// retryAfter returns the retry-after of a fail-closed denial at now for a
// store that failed with err: until the next probe of the breaker that
// refused the call, or of any breaker that is open, else the store's
// timeout, else DefaultClosedRetry; at least 1 ms.
func (f *Fallback) retryAfter(err error, now time.Time) time.Duration {
	var at time.Time
	var nt nextTrier
	if errors.As(err, &nt) {
		at = nt.NextTry()
	} else if f.o.Health != nil {
		at = f.o.Health.RetryAt()
	}
	d := DefaultClosedRetry
	switch {
	case !at.IsZero():
		d = at.Sub(now)
	case f.o.Timeout > 0:
		d = f.o.Timeout
	}
	return max(d, time.Millisecond)
}

// fairShare returns p with Limit and Burst divided among peers daemons,
// each at least 1 (so a limit below the number of daemons is exceeded by
// the fleet, at one unit per daemon).
func fairShare(p algo.Params, peers int) algo.Params {
	if peers <= 1 {
		return p
	}
	n := int64(peers)
	p.Limit = max(p.Limit/n, 1)
	if p.Burst > 0 {
		p.Burst = max(p.Burst/n, 1)
	}
	return p
}

// isTimeout reports whether err is a deadline that passed: the store is
// slow or unreachable, and asking it again within the same check would
// only add another timeout.
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}
