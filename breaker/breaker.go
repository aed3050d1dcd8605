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
	DefaultWindow      = time.Second
	DefaultFailureRate = 50
	DefaultMinCalls    = 20
	DefaultFailures    = 5
	DefaultCooldown    = 250 * time.Millisecond
	DefaultProbes      = 1
	DefaultSuccesses   = 2
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
	// Window is the rolling window calls are counted in (DefaultWindow),
	// in buckets of a tenth of it.
	Window time.Duration
	// FailureRate is the share of the window's calls, in percent, whose
	// failure opens the breaker once the window holds MinCalls calls
	// (DefaultFailureRate); above 100 means 100.
	FailureRate int
	// MinCalls is the fewest calls in the window for FailureRate to
	// judge the node (DefaultMinCalls).
	MinCalls int
	// Failures is how many calls failing in a row, none succeeding in
	// between, open the breaker while the window holds fewer than
	// MinCalls calls: a node that answers nothing, seen by a client that
	// calls it little (DefaultFailures).
	Failures int
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
// defaults, and FailureRate at most 100.
func (o Options) WithDefaults() Options {
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.FailureRate <= 0 {
		o.FailureRate = DefaultFailureRate
	}
	o.FailureRate = min(o.FailureRate, 100)
	if o.MinCalls <= 0 {
		o.MinCalls = DefaultMinCalls
	}
	if o.Failures <= 0 {
		o.Failures = DefaultFailures
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
// Closed, it allows every call and counts the calls reported to Done in a
// rolling window of Window (ten buckets of a tenth of it each): how many
// ended, how many failed. It opens when the window holds at least
// MinCalls calls of which at least FailureRate percent failed: a node
// that is down or cannot keep up fails most calls, while a busy, healthy
// node whose few slow calls outlast the caller's timeout answers the
// others, and stays in use. A failed call is only ever a share of the
// decisions: the breaker takes the rest away from the node only when
// that share is at least FailureRate. While the window holds fewer than
// MinCalls calls, too few for a share to mean much, Failures calls
// failing in a row, none succeeding in between, open it: a node that
// answers nothing, seen by a client that calls it little. Either way the
// failures must fall in two buckets or more: a single burst of them (the
// calls in flight when the caller or the node stalled, all timing out at
// once) does not open it alone. Only the calls
// the caller reports to Done as failed count as failures: those whose
// error says the node is unhealthy (a timeout, a broken connection), not
// those the node answered with an error of the caller's making, which
// count as successes.
//
// Open, it allows no call for Cooldown; RetryAt says when the next probe
// may go. The first Allow at or after RetryAt makes it half-open.
//
// Half-open, it allows at most Probes calls in flight at a time; Successes
// successful probes in a row close it, with an empty window, and a
// failed probe opens it again for a new Cooldown.
//
// Results of calls allowed before the last change of state are ignored:
// they describe a node the breaker has already judged.
//
// The breaker reads no clock: every method that needs the time takes it,
// so that tests control it.
//
// A closed Breaker costs one atomic load per Allow, and per Done a
// compare-and-swap on the window's current bucket (and, for a failure,
// a read of the ten buckets); no lock unless it opens, and no allocation
// in any state.
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
	// streak counts the failures since the last success while closed.
	streak atomic.Int64
	// bucketNs is the span of one bucket of the window, in nanoseconds.
	bucketNs int64

	_ [64]byte // keeps the buckets, written by every Done, off the line of word
	// buckets are the window's counts while closed, one bucket word each
	// (see bucketWord), bucket number n in buckets[n%numBuckets].
	buckets [numBuckets]atomic.Uint64
	_       [64]byte

	mu        sync.Mutex
	probes    []uint64 // half-open: the numbers of the probes in flight
	lastProbe uint64   // the number of the last probe allowed
	successes int      // half-open: successful probes in a row

	stateGauge *metrics.Gauge
	gaugeName  string              // the name stateGauge is registered under
	toState    [3]*metrics.Counter // by State
}

// The window's buckets. A bucket word holds the bucket's number (its
// start in bucket spans since the Unix epoch, modulo 1<<epochBits) and
// its counts of calls and failures, each saturating at countMask:
// epoch<<(2*countBits) | calls<<countBits | failures.
const (
	numBuckets = 10
	countBits  = 18
	countMask  = 1<<countBits - 1
	epochBits  = 64 - 2*countBits
	epochMask  = 1<<epochBits - 1
	// maxLag is how many buckets behind a bucket's number a result may
	// be and be dropped as stale; a bucket further behind is taken for
	// one a full turn of the numbers earlier, and replaced.
	maxLag = 1 << 16
)

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
		bucketNs:   max(int64(o.Window/numBuckets), 1),
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
// ticket is ignored; of a call's ticket while closed, it counts the call
// twice.
func (b *Breaker) Done(t Ticket, now time.Time, failed bool) {
	if State(t.word&stateMask) != Closed {
		b.done(t, now, failed)
		return
	}
	if t.word != b.word.Load() {
		return // a call from before the last change of state
	}
	b.count(now.UnixNano(), failed)
	if failed && b.trips(now.UnixNano()) {
		b.open(t, now)
	}
}

// count adds a call that ended at now (Unix ns), failed or not, to the
// window's bucket of now and to the failures in a row.
func (b *Breaker) count(now int64, failed bool) {
	if failed {
		b.streak.Add(1)
	} else if b.streak.Load() != 0 {
		b.streak.Store(0)
	}
	n := now / b.bucketNs
	epoch := uint64(n) & epochMask
	slot := &b.buckets[uint64(n)%numBuckets]
	for {
		w := slot.Load()
		nw := bucketWord(epoch, 1, failed)
		switch we := w >> (2 * countBits); {
		case we == epoch:
			nw = w
			if calls := w >> countBits & countMask; calls < countMask {
				nw += 1 << countBits
				if failed {
					nw++
				}
			}
		case (we-epoch)&epochMask < maxLag:
			return // the slot holds a later bucket: now is stale
		}
		if w == nw || slot.CompareAndSwap(w, nw) {
			return
		}
	}
}

// bucketWord returns the word of bucket epoch holding calls calls, of
// which one failed when failed.
func bucketWord(epoch, calls uint64, failed bool) uint64 {
	w := epoch<<(2*countBits) | calls<<countBits
	if failed {
		w++
	}
	return w
}

// window returns the calls and failures counted in the window that ends
// with the bucket of now (Unix ns), and how many of its buckets hold
// failures.
func (b *Breaker) window(now int64) (calls, failures, failing int) {
	epoch := uint64(now/b.bucketNs) & epochMask
	for i := range b.buckets {
		w := b.buckets[i].Load()
		if (epoch-w>>(2*countBits))&epochMask < numBuckets {
			calls += int(w >> countBits & countMask)
			f := int(w & countMask)
			failures += f
			failing += min(f, 1)
		}
	}
	return calls, failures, failing
}

// trips reports whether the window at now (Unix ns) and the failures in
// a row say the node is unhealthy: FailureRate of at least MinCalls
// calls failed, or, below MinCalls, Failures in a row; and the failures
// fall in two buckets or more, so that one burst (every call in flight
// timing out at once, after a stall of the caller or of the node shorter
// than a bucket) does not open it alone.
func (b *Breaker) trips(now int64) bool {
	calls, failures, failing := b.window(now)
	switch {
	case failing < 2:
		return false
	case calls < b.o.MinCalls:
		return b.streak.Load() >= int64(b.o.Failures)
	}
	return failures*100 >= b.o.FailureRate*calls
}

// open opens the breaker at now unless its state changed since t was
// given.
func (b *Breaker) open(t Ticket, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.word == b.word.Load() {
		b.setState(Open, now)
	}
}

// done is Done while not closed: a probe's result.
func (b *Breaker) done(t Ticket, now time.Time, failed bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t.word != b.word.Load() {
		return // a call from before the last change of state
	}
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

// setState moves the breaker to s at now and returns the new word. The
// caller holds mu.
func (b *Breaker) setState(s State, now time.Time) uint64 {
	switch s {
	case Open:
		b.openErr.Store(&OpenError{Name: b.name, RetryAt: now.Add(b.o.Cooldown)})
	case HalfOpen:
		b.probes, b.successes = b.probes[:0], 0
	case Closed:
		for i := range b.buckets {
			b.buckets[i].Store(0)
		}
		b.streak.Store(0)
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
