// Package region holds one limit across regions: each region decides a
// global rule's keys exactly against its own Redis, with the rule's limit
// scaled to the region's share of each key; one elected daemon per region
// renews the shares against a global store (Ledger), sized by the
// region's recent demand, so that the live shares of a key never sum to
// more than its limit. Nothing on the decision path waits on the global
// store. docs/regions.md describes the model, its bounds and its costs.
package region

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// Defaults of Options.
const (
	// DefaultInterval is how often demand is flushed, shares loaded and
	// (by the renewer) renewed.
	DefaultInterval = 250 * time.Millisecond
	// DefaultLeaseIntervals is the default lease length, in intervals.
	DefaultLeaseIntervals = 4
)

// Keys in the regional Redis.
const (
	// DemandKey is the hash of the region's demand since the renewer
	// last took it: field id → units.
	DemandKey = "rld:region:demand"
	// SharesKey is the hash of the region's shares: field id →
	// "units:expiry unix ms".
	SharesKey = "rld:region:shares"
	// RenewerKey holds the id of the region's renewer.
	RenewerKey = "rld:region:renewer"
	// SharesChannel is the channel on which the renewer announces that
	// it wrote new shares: every daemon loads them at once.
	SharesChannel = "rld:region:shares"
	// AskChannel is the channel on which a daemon asks the renewer for
	// an early renewal of a key it refused under its live share: one
	// message per key, the key's field id.
	AskChannel = "rld:region:ask"
)

// flushLeadDiv places the renewer's pass after the daemons' flushes:
// every daemon flushes its demand at each multiple of the interval (on
// its own clock), the renewer takes it interval/flushLeadDiv later.
const flushLeadDiv = 10

// Options configure a Region. Zero durations mean their defaults.
type Options struct {
	// Region is this region's name, one of Regions.
	Region string
	// Regions names every region.
	Regions []string
	// Interval is the period of flushes, loads and renewals.
	Interval time.Duration
	// Lease is the length of a share's lease (DefaultLeaseIntervals ×
	// Interval); it must be longer than Interval.
	Lease time.Duration
	// ID names this daemon in the renewer election; it must be unique in
	// the region.
	ID string
	// Local is the region's own Redis; when nil, DialLocal connects to
	// it, tried again at each tick until it succeeds.
	Local rueidis.Client
	// Global is the global store; when nil, DialGlobal connects to it
	// when this daemon first renews, tried again at each pass.
	Global rueidis.Client
	// DialLocal and DialGlobal connect to the two stores when Local or
	// Global is nil; the Region then closes the clients they made.
	DialLocal, DialGlobal func() (rueidis.Client, error)
	// Logger logs renewal failures and role changes (nil: slog.Default).
	Logger *slog.Logger
}

// Region is one daemon's part in a region: it counts the demand of the
// global keys (Store), flushes it to the regional Redis, loads the
// region's shares from it, and runs the renewer when elected.
type Region struct {
	o     Options
	table *Table
	st    stats

	// The loop's goroutine's only (and Close's, after it): the regional
	// client, made when first needed.
	local    rueidis.Client
	ownLocal bool // local was dialled by the Region
	// The ledger on the global store, made when first needed by the loop
	// or a strict key's renewal (under ledgerMu, as ownGlobal).
	ledger    atomic.Pointer[Ledger]
	ledgerMu  sync.Mutex
	ownGlobal rueidis.Client // the global client dialled by the Region
	closed    bool           // Close ran: dial nothing more

	flights flights                        // the strict keys' renewals in flight
	shared  atomic.Pointer[rueidis.Client] // local, for other goroutines

	renewer     renewer     // the loop's goroutine's only
	renewerHeld atomic.Bool // renewer.held, for other goroutines
	stop        chan struct{}
	done        chan struct{}
	notify      chan struct{} // a message on SharesChannel: load now
	// subscribed is set by every message the subscriber receives, and
	// cleared when its subscription fails (messages may have been lost).
	subscribed atomic.Bool
	// msgLoad is when the loop last loaded the shares on a message (unix
	// ns; the loop's goroutine's only).
	msgLoad   int64
	nudge     chan struct{} // a key refused under its share: publish the asks
	wake      chan struct{} // an ask came to the renewer: renew early
	asked     asked         // the asks the renewer received, for its next pass
	subDone   chan struct{} // closed when the subscriber returns
	subCancel context.CancelFunc
	once      sync.Once
	started   atomic.Bool
}

// New returns a Region for o; Start runs its loop.
func New(o Options) (*Region, error) {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLeaseIntervals * o.Interval
	}
	if o.Lease <= o.Interval {
		return nil, fmt.Errorf("region: lease %s must be longer than the interval %s", o.Lease, o.Interval)
	}
	if o.ID == "" {
		return nil, errors.New("region: empty daemon id")
	}
	if o.Local == nil && o.DialLocal == nil || o.Global == nil && o.DialGlobal == nil {
		return nil, errors.New("region: need a client or a dial function for both the regional redis and the global store")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := checkRegions(o.Region, o.Regions); err != nil {
		return nil, fmt.Errorf("region: %w", err)
	}
	o.Regions = append([]string(nil), o.Regions...)
	r := &Region{o: o, table: NewTable(), stop: make(chan struct{}), done: make(chan struct{}), notify: make(chan struct{}, 1), nudge: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
	r.local, r.ownLocal = o.Local, o.Local == nil
	if o.Local != nil {
		r.shared.Store(&r.o.Local)
	}
	return r, nil
}

// connect makes the regional client when there is none yet, and reports
// whether there is one.
func (r *Region) connect() bool {
	if r.local != nil {
		return true
	}
	c, err := r.o.DialLocal()
	if err != nil {
		r.o.Logger.Warn("region: connect to the regional redis", "err", err)
		return false
	}
	r.local = c
	r.shared.Store(&c)
	return true
}

// ledgerOf returns the ledger, connecting to the global store when
// there is none yet; nil when that fails.
func (r *Region) ledgerOf() *Ledger {
	if l := r.ledger.Load(); l != nil {
		return l
	}
	r.ledgerMu.Lock()
	defer r.ledgerMu.Unlock()
	if l := r.ledger.Load(); l != nil || r.closed {
		return l
	}
	c := r.o.Global
	if c == nil {
		var err error
		if c, err = r.o.DialGlobal(); err != nil {
			r.o.Logger.Warn("region: connect to the global store", "err", err)
			return nil
		}
		r.ownGlobal = c
	}
	l, err := NewLedger(c, r.o.Region, r.o.Regions, r.o.Lease)
	if err != nil {
		r.o.Logger.Error("region: ledger", "err", err)
		return nil
	}
	r.ledger.Store(l)
	return l
}

// Table returns the region's shares table.
func (r *Region) Table() *Table { return r.table }

// Options returns r's options, defaults filled in.
func (r *Region) Options() Options { return r.o }

// Start runs r's loop until Close. Call it once.
func (r *Region) Start() {
	r.started.Store(true)
	go r.loop()
}

// Close stops the loop, gives up the renewer role when r holds it, and
// waits until the loop has returned. It closes the clients it dialled;
// those given in Options are the caller's.
func (r *Region) Close() {
	r.once.Do(func() {
		close(r.stop)
		if r.started.Load() {
			<-r.done
		}
		if r.subCancel != nil {
			r.subCancel()
			<-r.subDone
		}
		ctx, cancel := context.WithTimeout(context.Background(), r.o.Interval)
		defer cancel()
		r.resign(ctx)
		if r.ownLocal && r.local != nil {
			r.local.Close()
		}
		r.ledgerMu.Lock()
		r.closed = true
		if r.ownGlobal != nil {
			r.ownGlobal.Close()
		}
		r.ledgerMu.Unlock()
	})
}

// loop ticks at every multiple of the interval (on this host's clock,
// so the daemons of a region flush together, just before the renewer
// takes their demand), and loads the shares whenever the renewer
// announces new ones.
func (r *Region) loop() {
	defer close(r.done)
	next := time.Now().Truncate(r.o.Interval)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-r.notify:
			if err := r.step(r.load); err != nil {
				r.o.Logger.Warn("region: load shares", "err", err)
			} else {
				r.msgLoad = time.Now().UnixNano()
			}
			continue
		case <-r.nudge:
			if err := r.step(r.publishAsks); err != nil {
				r.o.Logger.Warn("region: ask for early renewals", "err", err)
			}
			continue
		case <-r.wake:
			if r.renewer.held {
				r.early(next.Add(r.o.Interval / flushLeadDiv))
			}
			continue
		case <-t.C:
			r.tickAt(next)
		}
		// The next boundary; a tick that overran runs late, not skipped.
		next = next.Add(r.o.Interval)
		if last := time.Now().Truncate(r.o.Interval); next.Before(last) {
			next = last // more than an interval behind: the latest boundary
		}
		t.Reset(time.Until(next))
	}
}

// tick runs one interval's work: flush this daemon's demand, renew when
// elected, load the shares. Only the loop calls it (or a test, on a
// Region not started).
func (r *Region) tick() { r.tickAt(time.Time{}) }

// tickAt is tick for the tick due at boundary: the renewer's pass waits
// until boundary + interval/flushLeadDiv, when the other daemons' flushes
// of the same boundary have landed (no wait for a zero boundary).
func (r *Region) tickAt(boundary time.Time) {
	if !r.connect() {
		return
	}
	r.subscribe()
	if err := r.step(r.flush); err != nil {
		r.o.Logger.Warn("region: flush demand", "err", err)
	}
	var held bool
	r.step(func(ctx context.Context) error {
		held = r.elect(ctx)
		return nil
	})
	if held {
		if boundary.IsZero() {
			boundary = time.Now()
		} else if !r.sleepUntil(r.passAt(boundary)) {
			return
		}
		// A second renewal may delay the next pass by a quarter interval.
		r.pass(r.passAt(boundary.Add(r.o.Interval)).Add(r.o.Interval / 4))
	}
	if r.loadedOnMessage() {
		r.st.skippedLoads.Add(1)
		return
	}
	if err := r.step(r.load); err != nil {
		r.o.Logger.Warn("region: load shares", "err", err)
	}
}

// loadedOnMessage reports whether the loop loaded the shares on a
// message within the last interval, while subscribed: every write of
// the shares hash publishes, so the tick's load would read what that one
// did. A subscription that failed (its messages may be lost) and a
// renewer that has not published for an interval leave the tick's load
// as the backstop.
func (r *Region) loadedOnMessage() bool {
	return r.subscribed.Load() && time.Now().UnixNano()-r.msgLoad < int64(r.o.Interval)
}

// passAt is when the renewer takes the demand flushed at boundary: one
// lead (interval/flushLeadDiv) after it, or after now when the tick runs
// late (the other daemons, on the same stalled host, flush late too).
func (r *Region) passAt(boundary time.Time) time.Time {
	lead := r.o.Interval / flushLeadDiv
	if late := time.Now().Add(lead); late.Sub(boundary) > 2*lead {
		return late
	}
	return boundary.Add(lead)
}

// sleepUntil waits until at, and reports false when r is closed first.
func (r *Region) sleepUntil(at time.Time) bool {
	d := time.Until(at)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.stop:
		return false
	case <-t.C:
		return true
	}
}

// subscribe starts, once, the goroutine that listens on SharesChannel
// and asks the loop to load the shares on each message. The per-interval
// load stays the backstop for a lost message or connection.
func (r *Region) subscribe() {
	if r.subCancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.subCancel, r.subDone = cancel, make(chan struct{})
	go r.listen(ctx, r.local)
}

// listen runs SUBSCRIBE on c until ctx is done, again after an interval
// when the connection fails.
func (r *Region) listen(ctx context.Context, c rueidis.Client) {
	defer close(r.subDone)
	on := func(m rueidis.PubSubMessage) {
		r.subscribed.Store(true)
		if m.Channel == AskChannel {
			if r.renewerHeld.Load() {
				r.asked.add(m.Message)
				select {
				case r.wake <- struct{}{}:
				default: // an early renewal is due already
				}
			}
			return
		}
		select {
		case r.notify <- struct{}{}:
		default: // a load is due already
		}
	}
	for ctx.Err() == nil {
		err := c.Receive(ctx, c.B().Subscribe().Channel(SharesChannel, AskChannel).Build(), on)
		r.subscribed.Store(false)
		if ctx.Err() != nil {
			return
		}
		r.o.Logger.Warn("region: subscribe to shares", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(r.o.Interval):
		}
	}
}

// step runs f with a deadline of one interval: a slow store delays the
// next tick, never a decision.
func (r *Region) step(f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), r.o.Interval)
	defer cancel()
	return f(ctx)
}

// flush adds this daemon's demand to the regional demand hash, in one
// pipelined round trip. Demand that could not be written is lost: it
// only sizes the next share.
func (r *Region) flush(ctx context.Context) error {
	ds := r.table.TakeDemand()
	if len(ds) == 0 {
		return nil
	}
	c := r.local
	cmds := make(rueidis.Commands, len(ds))
	for i, d := range ds {
		cmds[i] = c.B().Hincrby().Key(DemandKey).Field(d.Field).Increment(d.Units).Build()
	}
	return doAll(ctx, c, cmds, "hincrby "+DemandKey)
}

// askGap is the least time between two asks of one key by one daemon.
func (r *Region) askGap() time.Duration { return r.o.Interval / askGapDiv }

// askGapDiv divides the interval into the least gap between two asks of
// one key by one daemon.
const askGapDiv = 4

// nudgeAsks wakes the loop to publish the keys marked for an early
// renewal; it never blocks.
func (r *Region) nudgeAsks() {
	select {
	case r.nudge <- struct{}{}:
	default: // a publish is due already
	}
}

// publishAsks publishes on AskChannel the keys marked for an early
// renewal, in one pipelined round trip.
func (r *Region) publishAsks(ctx context.Context) error {
	if !r.connect() {
		return nil
	}
	fields := r.table.TakeAsks()
	if len(fields) == 0 {
		return nil
	}
	c := r.local
	cmds := make(rueidis.Commands, len(fields))
	for i, f := range fields {
		cmds[i] = c.B().Publish().Channel(AskChannel).Message(f).Build()
	}
	return doAll(ctx, c, cmds, "publish "+AskChannel)
}

// doAll sends cmds to c in one pipelined round trip and returns the
// first error, wrapped with what the commands do.
func doAll(ctx context.Context, c rueidis.Client, cmds rueidis.Commands, what string) error {
	for _, res := range c.DoMulti(ctx, cmds...) {
		if err := res.Error(); err != nil {
			return fmt.Errorf("region: %s: %w", what, err)
		}
	}
	return nil
}

// asked is the set of keys asked for an early renewal since the
// renewer's last pass; the subscriber adds, the pass takes.
type asked struct {
	mu sync.Mutex
	m  map[string]struct{}
}

// add adds the field id f.
func (a *asked) add(f string) {
	a.mu.Lock()
	if a.m == nil {
		a.m = map[string]struct{}{}
	}
	a.m[f] = struct{}{}
	a.mu.Unlock()
}

// take returns the set and empties it.
func (a *asked) take() map[string]struct{} {
	a.mu.Lock()
	m := a.m
	a.m = nil
	a.mu.Unlock()
	return m
}

// load installs the regional shares hash into the table. A failed load
// keeps the table as it was: its shares hold until their expiry.
func (r *Region) load(ctx context.Context) error {
	r.st.loads.Add(1)
	m, err := r.local.Do(ctx, r.local.B().Hgetall().Key(SharesKey).Build()).AsStrMap()
	if err != nil {
		return fmt.Errorf("region: hgetall %s: %w", SharesKey, err)
	}
	return r.table.Install(m)
}
