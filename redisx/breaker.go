package redisx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"
)

// Defaults of BreakerOptions.
const (
	DefaultBreakerFailures  = 5
	DefaultBreakerWindow    = time.Second
	DefaultBreakerCooldown  = 250 * time.Millisecond
	DefaultBreakerProbes    = 1
	DefaultBreakerSuccesses = 2
)

// ErrBreakerOpen is wrapped by the error of a call that a Breaker did not
// allow. The error is a *BreakerOpenError.
var ErrBreakerOpen = errors.New("circuit breaker open")

// BreakerOpenError is the error of a call a Breaker did not allow.
type BreakerOpenError struct {
	// Name is the breaker's name: the Redis node it guards.
	Name string
	// RetryAt is when the next probe may go: the end of the cool-down.
	// While the breaker is half-open it is in the past: probes are being
	// made, and the next one may go when one of them ends.
	RetryAt time.Time
}

// Error says which breaker refused and when the next probe may go.
func (e *BreakerOpenError) Error() string {
	return fmt.Sprintf("redisx: redis %s: %v, next probe at %s",
		e.Name, ErrBreakerOpen, e.RetryAt.Format(time.RFC3339Nano))
}

// NextTry returns RetryAt: when the store may next be tried. Package
// policy reads it (through an interface, without importing redisx) to
// tell a fail-closed rule's clients when to retry.
func (e *BreakerOpenError) NextTry() time.Time { return e.RetryAt }

// Unwrap returns ErrBreakerOpen.
func (e *BreakerOpenError) Unwrap() error { return ErrBreakerOpen }

// BreakerState is the state of a Breaker. Its value is the value of the
// rld_redis_breaker_state gauge.
type BreakerState int32

// The states of a Breaker.
const (
	// BreakerClosed allows every call.
	BreakerClosed BreakerState = iota
	// BreakerOpen allows no call until its cool-down has passed.
	BreakerOpen
	// BreakerHalfOpen allows a few probe calls, whose results close the
	// breaker or open it again.
	BreakerHalfOpen
)

// String returns "closed", "open" or "half-open".
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("BreakerState(%d)", int32(s))
}

// BreakerOptions configures a Breaker. A field of 0 or less means its
// default.
type BreakerOptions struct {
	// Failures is how many failed calls within Window open the breaker
	// (DefaultBreakerFailures).
	Failures int
	// Window is the sliding window failures are counted in
	// (DefaultBreakerWindow).
	Window time.Duration
	// Cooldown is how long the breaker stays open before it lets probes
	// go (DefaultBreakerCooldown).
	Cooldown time.Duration
	// Probes is how many probe calls may be in flight at once while the
	// breaker is half-open (DefaultBreakerProbes).
	Probes int
	// Successes is how many successful probes in a row close the breaker
	// (DefaultBreakerSuccesses).
	Successes int
}

func (o BreakerOptions) withDefaults() BreakerOptions {
	if o.Failures <= 0 {
		o.Failures = DefaultBreakerFailures
	}
	if o.Window <= 0 {
		o.Window = DefaultBreakerWindow
	}
	if o.Cooldown <= 0 {
		o.Cooldown = DefaultBreakerCooldown
	}
	if o.Probes <= 0 {
		o.Probes = DefaultBreakerProbes
	}
	if o.Successes <= 0 {
		o.Successes = DefaultBreakerSuccesses
	}
	return o
}

// BreakerTicket is what Allow gives a call it allows, to be handed back to
// Done with the call's result. It is a plain value: passing it around
// allocates nothing. The zero BreakerTicket is never current.
type BreakerTicket struct {
	word  uint64 // the breaker's word when the call was allowed
	probe uint64 // the probe's number (half-open only)
}

// Breaker is a circuit breaker in front of one Redis node. It is safe for
// concurrent use. Create it with NewBreaker.
//
// Closed, it allows every call, and opens when Failures calls fail within
// any span of Window (a sliding window over the times of the last Failures
// failures: successes in between do not erase failures, so "5 failures in
// 1 s" means that, whatever the traffic). Only failures that say Redis is
// unhealthy count (see isFailure): timeouts, connection errors, and
// replies such as CLUSTERDOWN, LOADING, MASTERDOWN, READONLY or TRYAGAIN;
// a script error or WRONGTYPE is the caller's problem and counts as a
// success.
//
// Open, it allows no call for Cooldown; RetryAt says when the next probe
// may go. The first Allow at or after RetryAt makes it half-open.
//
// Half-open, it allows at most Probes calls in flight at a time; Successes
// successful probes in a row close it, and a failed probe opens it again
// for a new Cooldown.
//
// Results of calls allowed before the last change of state are ignored:
// they describe a Redis the breaker has already judged.
//
// The breaker reads no clock: every method that needs the time takes it,
// so that tests control it.
//
// A closed Breaker costs one atomic load per Allow and nothing per
// successful Done; neither allocates in any state.
type Breaker struct {
	name string
	o    BreakerOptions

	// word is gen<<2 | state; gen changes at every change of state, so a
	// ticket (the word when the call was allowed) tells whether its call
	// belongs to the current state.
	word atomic.Uint64
	// openErr is the error of refused calls since the last opening (nil
	// before the first).
	openErr atomic.Pointer[BreakerOpenError]

	mu        sync.Mutex
	fails     []int64  // closed: the times (Unix ns) of the last failures, a ring
	nfails    int      // how many of fails are set
	nextFail  int      // where the next failure goes in fails
	probes    []uint64 // half-open: the numbers of the probes in flight
	lastProbe uint64   // the number of the last probe allowed
	successes int      // half-open: successful probes in a row

	stateGauge *metrics.Gauge
	gaugeName  string              // the name stateGauge is registered under
	toState    [3]*metrics.Counter // by BreakerState
}

const (
	stateBits = 2
	stateMask = 1<<stateBits - 1
)

// NewBreaker returns a closed Breaker for the Redis node name (its
// host:port) with options o, and creates its metrics:
// rld_redis_breaker_state{node} (0 closed, 1 open, 2 half-open) and
// rld_redis_breaker_transitions_total{node,to} (to is "open",
// "half_open" or "closed"). Breakers of the same name share their
// metrics: the newest one sets the gauge.
func NewBreaker(name string, o BreakerOptions) *Breaker {
	o = o.withDefaults()
	node := `node="` + labelEscaper.Replace(name) + `"`
	gauge := `rld_redis_breaker_state{` + node + `}`
	b := &Breaker{
		name:       name,
		o:          o,
		fails:      make([]int64, o.Failures),
		probes:     make([]uint64, 0, o.Probes),
		stateGauge: metrics.GetOrCreateGauge(gauge, nil),
		gaugeName:  gauge,
	}
	for s, to := range [...]string{BreakerClosed: "closed", BreakerOpen: "open", BreakerHalfOpen: "half_open"} {
		b.toState[s] = metrics.GetOrCreateCounter(`rld_redis_breaker_transitions_total{` + node + `,to="` + to + `"}`)
	}
	b.word.Store(1<<stateBits | uint64(BreakerClosed)) // gen 1: the zero ticket is never current
	b.stateGauge.Set(float64(BreakerClosed))
	return b
}

// labelEscaper escapes a Prometheus label value.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// stateGaugeName returns the name of b's rld_redis_breaker_state series.
func (b *Breaker) stateGaugeName() string { return b.gaugeName }

// Name returns the name the breaker was created with.
func (b *Breaker) Name() string { return b.name }

// Allow reports whether a call may be made at now. When it may, err is
// nil and the caller must make the call and then call Done with the
// ticket, exactly once. When it may not, err is a *BreakerOpenError
// (wrapping ErrBreakerOpen) that says when the next probe may go.
func (b *Breaker) Allow(now time.Time) (BreakerTicket, error) {
	if w := b.word.Load(); w&stateMask == uint64(BreakerClosed) {
		return BreakerTicket{word: w}, nil // the common case: inlined
	}
	return b.allowSlow(now)
}

// Pass is Allow for a call that must not be a probe: it allows the call
// only while the breaker is closed, and otherwise refuses it with the
// *BreakerOpenError of the last opening, whose RetryAt says when the
// next probe may go (in the past once it may, or while probes are being
// made). Probes are made by the callers of Allow: a Client's prober, so
// that no check waits on a node that may still be down. A call Pass
// allows is reported to Done like any other.
func (b *Breaker) Pass() (BreakerTicket, error) {
	if w := b.word.Load(); w&stateMask == uint64(BreakerClosed) {
		return BreakerTicket{word: w}, nil
	}
	return BreakerTicket{}, b.openErr.Load() // set: a breaker not closed has opened
}

// allowSlow is Allow when the breaker was not closed.
func (b *Breaker) allowSlow(now time.Time) (BreakerTicket, error) {
	w := b.word.Load()
	if BreakerState(w&stateMask) == BreakerOpen {
		if e := b.openErr.Load(); now.Before(e.RetryAt) {
			return BreakerTicket{}, e // the common case while open: no lock
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w = b.word.Load()
	switch BreakerState(w & stateMask) {
	case BreakerClosed:
		return BreakerTicket{word: w}, nil
	case BreakerOpen:
		if e := b.openErr.Load(); now.Before(e.RetryAt) {
			return BreakerTicket{}, e
		}
		w = b.setState(BreakerHalfOpen, now)
	}
	if len(b.probes) >= b.o.Probes {
		return BreakerTicket{}, b.openErr.Load()
	}
	b.lastProbe++
	b.probes = append(b.probes, b.lastProbe)
	return BreakerTicket{word: w, probe: b.lastProbe}, nil
}

// Done records the result of a call that Allow allowed with ticket t: err
// is the call's error (nil on success), now the time it ended. A second
// Done of a probe's ticket is ignored; of a failed call's ticket while
// closed, it counts the failure twice.
func (b *Breaker) Done(t BreakerTicket, now time.Time, err error) {
	if err == nil && BreakerState(t.word&stateMask) == BreakerClosed {
		return // the common case: inlined, nothing to record
	}
	b.done(t, now, err)
}

// done is Done but for a success while closed.
func (b *Breaker) done(t BreakerTicket, now time.Time, err error) {
	failed := isFailure(err)
	if !failed && BreakerState(t.word&stateMask) == BreakerClosed {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.word != b.word.Load() {
		return // a call from before the last change of state
	}
	switch BreakerState(t.word & stateMask) {
	case BreakerClosed:
		b.fails[b.nextFail] = now.UnixNano()
		b.nextFail = (b.nextFail + 1) % len(b.fails)
		b.nfails = min(b.nfails+1, len(b.fails))
		if b.recentFailures(now) >= b.o.Failures {
			b.setState(BreakerOpen, now)
		}
	case BreakerHalfOpen:
		i := slices.Index(b.probes, t.probe)
		if i < 0 {
			return // a second Done
		}
		b.probes = slices.Delete(b.probes, i, i+1)
		if failed {
			b.setState(BreakerOpen, now)
			return
		}
		if b.successes++; b.successes >= b.o.Successes {
			b.setState(BreakerClosed, now)
		}
	}
}

// recentFailures counts the recorded failures within Window before now.
// The caller holds mu.
func (b *Breaker) recentFailures(now time.Time) int {
	since := now.Add(-b.o.Window).UnixNano()
	n := 0
	for _, f := range b.fails[:b.nfails] {
		if f > since {
			n++
		}
	}
	return n
}

// setState moves the breaker to s at now and returns the new word. The
// caller holds mu.
func (b *Breaker) setState(s BreakerState, now time.Time) uint64 {
	switch s {
	case BreakerOpen:
		b.openErr.Store(&BreakerOpenError{Name: b.name, RetryAt: now.Add(b.o.Cooldown)})
	case BreakerHalfOpen:
		b.probes, b.successes = b.probes[:0], 0
	case BreakerClosed:
		b.nfails, b.nextFail = 0, 0
	}
	w := (b.word.Load()>>stateBits+1)<<stateBits | uint64(s)
	b.word.Store(w)
	b.stateGauge.Set(float64(s))
	b.toState[s].Inc()
	return w
}

// State returns the state of the breaker. An open breaker whose cool-down
// has passed stays open until the next Allow.
func (b *Breaker) State() BreakerState { return BreakerState(b.word.Load() & stateMask) }

// RetryAt returns when the next probe may go: the end of the cool-down
// while open, a time in the past while half-open, and the zero time while
// closed.
func (b *Breaker) RetryAt() time.Time {
	if b.State() == BreakerClosed {
		return time.Time{}
	}
	return b.openErr.Load().RetryAt
}

// failureReplies are the first words of the Redis error replies that say
// the node cannot serve now, whatever the command: they count as failures.
var failureReplies = map[string]bool{
	"CLUSTERDOWN": true, // the cluster, or the slot's shard, is down
	"LOADING":     true, // the dataset is being loaded after a restart
	"MASTERDOWN":  true, // a replica lost its primary
	"READONLY":    true, // a write reached a replica: a failover under way
	"TRYAGAIN":    true, // a slot is being migrated
	"BUSY":        true, // a script or function runs too long
	"MISCONF":     true, // persistence fails, writes are refused
	"NOREPLICAS":  true, // min-replicas-to-write not met
	"OOM":         true, // maxmemory reached, writes are refused
}

// isFailure reports whether err, the error of a Redis call, says the node
// is unhealthy, which a breaker counts: a deadline that passed, a
// connection that could not be made or broke, no connection (yet), or an
// error reply in failureReplies. Other error replies (WRONGTYPE, script
// errors, unknown commands) are answers from a healthy node, and a
// canceled call or a closed Client says nothing about Redis: they are not
// failures. A nil err is not.
func isFailure(err error) bool {
	if err == nil {
		return false
	}
	if re, ok := errors.AsType[*rueidis.RedisError](err); ok {
		if re.IsNil() {
			return false
		}
		word, _, _ := strings.Cut(re.Error(), " ")
		return failureReplies[word]
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, ErrNotConnected),
		errors.Is(err, rueidis.ErrClosing), // "closing or unable to connect"
		errors.Is(err, rueidis.ErrNoSlot),
		errors.Is(err, rueidis.ErrNoAddr),
		errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED),
		errors.Is(err, syscall.EPIPE):
		return true
	}
	_, ok := errors.AsType[net.Error](err) // *net.OpError of a dial, read or write; DNS errors
	return ok
}
