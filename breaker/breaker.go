// Package breaker is a circuit breaker: it stops calls to a backend that
// fails, lets a few probes through after a cool-down, and lets every call
// through again once they succeed. It reads no clock (every method that
// needs the time takes it) and does not judge errors: the caller says
// whether a call failed in a way that counts.
package breaker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
)

// Defaults of Options.
const (
	DefaultFailures  = 5
	DefaultWindow    = time.Second
	DefaultCooldown  = 250 * time.Millisecond
	DefaultProbes    = 1
	DefaultSuccesses = 2
)

// ErrOpen is wrapped by the error of a call that a Breaker did not
// allow. The error is a *OpenError.
var ErrOpen = errors.New("circuit breaker open")

// OpenError is the error of a call a Breaker did not allow.
type OpenError struct {
	// Name is the breaker's name: the node it guards.
	Name string
	// RetryAt is when the next probe may go: the end of the cool-down.
	// While the breaker is half-open it is in the past: probes are being
	// made, and the next one may go when one of them ends.
	RetryAt time.Time
}

// Error says which breaker refused and when the next probe may go.
func (e *OpenError) Error() string {
	return fmt.Sprintf("%s: %v, next probe at %s",
		e.Name, ErrOpen, e.RetryAt.Format(time.RFC3339Nano))
}

// NextTry returns RetryAt: when the node may next be tried. Package
// policy reads it (through an interface, without importing breaker) to
// tell a fail-closed rule's clients when to retry.
func (e *OpenError) NextTry() time.Time { return e.RetryAt }

// Unwrap returns ErrOpen.
func (e *OpenError) Unwrap() error { return ErrOpen }

// State is the state of a Breaker. Its value is the value of the
// breaker's state gauge (see New).
type State int32

// The states of a Breaker.
const (
	// Closed allows every call.
	Closed State = iota
	// Open allows no call until its cool-down has passed.
	Open
	// HalfOpen allows a few probe calls, whose results close the
	// breaker or open it again.
	HalfOpen
)

// String returns "closed", "open" or "half-open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// Options configures a Breaker. A field of 0 or less means its
// default.
type Options struct {
	// Failures is how many failed calls within Window open the breaker
	// (DefaultFailures).
	Failures int
	// Window is the sliding window failures are counted in
	// (DefaultWindow).
	Window time.Duration
	// Cooldown is how long the breaker stays open before it lets probes
	// go (DefaultCooldown).
	Cooldown time.Duration
	// Probes is how many probe calls may be in flight at once while the
	// breaker is half-open (DefaultProbes).
	Probes int
	// Successes is how many successful probes in a row close the breaker
	// (DefaultSuccesses).
	Successes int
}

// WithDefaults returns o with its fields of 0 or less set to their
// defaults.
func (o Options) WithDefaults() Options {
	if o.Failures <= 0 {
		o.Failures = DefaultFailures
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.Cooldown <= 0 {
		o.Cooldown = DefaultCooldown
	}
	if o.Probes <= 0 {
		o.Probes = DefaultProbes
	}
	if o.Successes <= 0 {
		o.Successes = DefaultSuccesses
	}
	return o
}

// Ticket is what Allow gives a call it allows, to be handed back to
// Done with the call's result. It is a plain value: passing it around
// allocates nothing. The zero Ticket is never current.
type Ticket struct {
	word  uint64 // the breaker's word when the call was allowed
	probe uint64 // the probe's number (half-open only)
}

// Breaker is a circuit breaker in front of one node. It is safe for
// concurrent use. Create it with New.
//
// Closed, it allows every call, and opens when Failures calls fail within
// any span of Window (a sliding window over the times of the last Failures
// failures: successes in between do not erase failures, so "5 failures in
// 1 s" means that, whatever the traffic). Only the calls the caller
// reports to Done as failed count: those whose error says the node is
// unhealthy (a timeout, a broken connection), not those the node answered
// with an error of the caller's making, which count as successes.
//
// Open, it allows no call for Cooldown; RetryAt says when the next probe
// may go. The first Allow at or after RetryAt makes it half-open.
//
// Half-open, it allows at most Probes calls in flight at a time; Successes
// successful probes in a row close it, and a failed probe opens it again
// for a new Cooldown.
//
// Results of calls allowed before the last change of state are ignored:
// they describe a node the breaker has already judged.
//
// The breaker reads no clock: every method that needs the time takes it,
// so that tests control it.
//
// A closed Breaker costs one atomic load per Allow and nothing per
// successful Done; neither allocates in any state.
type Breaker struct {
	name string
	o    Options

	// word is gen<<2 | state; gen changes at every change of state, so a
	// ticket (the word when the call was allowed) tells whether its call
	// belongs to the current state.
	word atomic.Uint64
	// openErr is the error of refused calls since the last opening (nil
	// before the first).
	openErr atomic.Pointer[OpenError]

	mu        sync.Mutex
	fails     []int64  // closed: the times (Unix ns) of the last failures, a ring
	nfails    int      // how many of fails are set
	nextFail  int      // where the next failure goes in fails
	probes    []uint64 // half-open: the numbers of the probes in flight
	lastProbe uint64   // the number of the last probe allowed
	successes int      // half-open: successful probes in a row

	stateGauge *metrics.Gauge
	gaugeName  string              // the name stateGauge is registered under
	toState    [3]*metrics.Counter // by State
}

const (
	stateBits = 2
	stateMask = 1<<stateBits - 1
)

// New returns a closed Breaker named name (the node it guards, such as
// its host:port) with options o, and creates its metrics, whose names
// start with metric: <metric>_state{node} (the State: 0 closed, 1 open, 2
// half-open) and <metric>_transitions_total{node,to} (to is "open",
// "half_open" or "closed"), node being name. Breakers of the same metric
// and name share their metrics: the newest one sets the gauge.
func New(metric, name string, o Options) *Breaker {
	o = o.WithDefaults()
	node := `node="` + labelEscaper.Replace(name) + `"`
	gauge := metric + `_state{` + node + `}`
	b := &Breaker{
		name:       name,
		o:          o,
		fails:      make([]int64, o.Failures),
		probes:     make([]uint64, 0, o.Probes),
		stateGauge: metrics.GetOrCreateGauge(gauge, nil),
		gaugeName:  gauge,
	}
	for s, to := range [...]string{Closed: "closed", Open: "open", HalfOpen: "half_open"} {
		b.toState[s] = metrics.GetOrCreateCounter(metric + `_transitions_total{` + node + `,to="` + to + `"}`)
	}
	b.word.Store(1<<stateBits | uint64(Closed)) // gen 1: the zero ticket is never current
	b.stateGauge.Set(float64(Closed))
	return b
}

// labelEscaper escapes a Prometheus label value.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// StateGauge returns the name of b's state gauge, for
// metrics.UnregisterMetric when the node it guards is gone.
func (b *Breaker) StateGauge() string { return b.gaugeName }

// Name returns the name the breaker was created with.
func (b *Breaker) Name() string { return b.name }

// Allow reports whether a call may be made at now. When it may, err is
// nil and the caller must make the call and then call Done with the
// ticket, exactly once. When it may not, err is a *OpenError
// (wrapping ErrOpen) that says when the next probe may go.
func (b *Breaker) Allow(now time.Time) (Ticket, error) {
	if w := b.word.Load(); w&stateMask == uint64(Closed) {
		return Ticket{word: w}, nil // the common case: inlined
	}
	return b.allowSlow(now)
}

// Pass is Allow for a call that must not be a probe: it allows the call
// only while the breaker is closed, and otherwise refuses it with the
// *OpenError of the last opening, whose RetryAt says when the
// next probe may go (in the past once it may, or while probes are being
// made). Probes are made by the callers of Allow (a prober in the
// background, say, so that no caller of Pass waits on a node that may
// still be down). A call Pass
// allows is reported to Done like any other.
func (b *Breaker) Pass() (Ticket, error) {
	if w := b.word.Load(); w&stateMask == uint64(Closed) {
		return Ticket{word: w}, nil
	}
	return Ticket{}, b.openErr.Load() // set: a breaker not closed has opened
}

// allowSlow is Allow when the breaker was not closed.
func (b *Breaker) allowSlow(now time.Time) (Ticket, error) {
	w := b.word.Load()
	if State(w&stateMask) == Open {
		if e := b.openErr.Load(); now.Before(e.RetryAt) {
			return Ticket{}, e // the common case while open: no lock
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w = b.word.Load()
	switch State(w & stateMask) {
	case Closed:
		return Ticket{word: w}, nil
	case Open:
		if e := b.openErr.Load(); now.Before(e.RetryAt) {
			return Ticket{}, e
		}
		w = b.setState(HalfOpen, now)
	}
	if len(b.probes) >= b.o.Probes {
		return Ticket{}, b.openErr.Load()
	}
	b.lastProbe++
	b.probes = append(b.probes, b.lastProbe)
	return Ticket{word: w, probe: b.lastProbe}, nil
}

// Done records the result of a call that Allow or Pass allowed with
// ticket t: failed says whether the call failed in a way that counts (the
// node is unhealthy), now is when it ended. A second Done of a probe's
// ticket is ignored; of a failed call's ticket while closed, it counts
// the failure twice.
func (b *Breaker) Done(t Ticket, now time.Time, failed bool) {
	if !failed && State(t.word&stateMask) == Closed {
		return // the common case: inlined, nothing to record
	}
	b.done(t, now, failed)
}

// Closed reports whether t was given while the breaker was closed: a
// successful call on such a ticket needs no Done, and no clock read for
// it (Done ignores it).
func (t Ticket) Closed() bool { return State(t.word&stateMask) == Closed }

// done is Done but for a success while closed.
func (b *Breaker) done(t Ticket, now time.Time, failed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.word != b.word.Load() {
		return // a call from before the last change of state
	}
	switch State(t.word & stateMask) {
	case Closed:
		b.fails[b.nextFail] = now.UnixNano()
		b.nextFail = (b.nextFail + 1) % len(b.fails)
		b.nfails = min(b.nfails+1, len(b.fails))
		if b.recentFailures(now) >= b.o.Failures {
			b.setState(Open, now)
		}
	case HalfOpen:
		i := slices.Index(b.probes, t.probe)
		if i < 0 {
			return // a second Done
		}
		b.probes = slices.Delete(b.probes, i, i+1)
		if failed {
			b.setState(Open, now)
			return
		}
		if b.successes++; b.successes >= b.o.Successes {
			b.setState(Closed, now)
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
func (b *Breaker) setState(s State, now time.Time) uint64 {
	switch s {
	case Open:
		b.openErr.Store(&OpenError{Name: b.name, RetryAt: now.Add(b.o.Cooldown)})
	case HalfOpen:
		b.probes, b.successes = b.probes[:0], 0
	case Closed:
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
func (b *Breaker) State() State { return State(b.word.Load() & stateMask) }

// RetryAt returns when the next probe may go: the end of the cool-down
// while open, a time in the past while half-open, and the zero time while
// closed.
func (b *Breaker) RetryAt() time.Time {
	if b.State() == Closed {
		return time.Time{}
	}
	return b.openErr.Load().RetryAt
}
