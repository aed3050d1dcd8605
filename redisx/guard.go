package redisx

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"

	"github.com/rld/rld/breaker"
	"github.com/rld/rld/redisx/keyslot"
)

// Cluster topology: the slot map that picks a key's breaker is refreshed
// every slotRefreshEvery, and soon (at most every slotRefreshGap) after a
// call fails or is refused, so that a failover is followed within about
// one gap of the cluster naming the new primary.
const (
	slotRefreshEvery   = time.Second
	slotRefreshGap     = 100 * time.Millisecond
	slotRefreshTimeout = 250 * time.Millisecond
)

// breakerMetric starts the names of the breakers' metrics:
// rld_redis_breaker_state{node} and
// rld_redis_breaker_transitions_total{node,to}.
const breakerMetric = "rld_redis_breaker"

// newBreaker returns a closed breaker for the node name, with its metrics.
func newBreaker(name string, o breaker.Options) *breaker.Breaker {
	return breaker.New(breakerMetric, name, o)
}

// unmappedBreaker names the breaker of the Cluster slots that no known
// primary serves (before the first refresh, or while a shard has none).
const unmappedBreaker = "cluster:unmapped-slots"

// guard holds the circuit breakers of a Client: one for the whole
// deployment in Standalone and Sentinel mode; in Cluster mode one per
// primary, picked by the slot map, and one for the slots the map does not
// place.
type guard struct {
	o    breaker.Options
	mode Mode
	// one is the only breaker (Standalone, Sentinel) or that of the
	// unmapped slots (Cluster).
	one *breaker.Breaker

	slots slotMap // Cluster only

	mu    sync.Mutex                                  // serialises changes of nodes
	nodes atomic.Pointer[map[string]*breaker.Breaker] // Cluster: by primary address, copy-on-write

	kick     chan struct{} // Cluster: asks the topology loop to refresh now
	lastKick atomic.Int64  // unix ns of the last kick sent

	opened chan struct{} // wakes the prober: a breaker may have opened
}

// newGuard returns the breakers of a Client with options o.
func newGuard(o Options) *guard {
	g := &guard{o: o.Breaker, mode: o.Mode, kick: make(chan struct{}, 1), opened: make(chan struct{}, 1)}
	switch o.Mode {
	case Standalone:
		g.one = newBreaker(o.Addrs[0], o.Breaker)
	case Sentinel:
		g.one = newBreaker("sentinel:"+o.MasterSet, o.Breaker)
	case Cluster:
		g.one = newBreaker(unmappedBreaker, o.Breaker)
		empty := map[string]*breaker.Breaker{}
		g.nodes.Store(&empty)
		g.slots.attach = g.attach
		g.slots.tls = o.TLS != nil
	}
	return g
}

// route returns the breaker of the call on the Redis key rkey and, in
// Cluster mode, the client of the connection to the primary the slot map
// names for it (nil otherwise: the call goes through the Client's
// rueidis client). The breaker and the connection come from one slot
// map, so a call never counts against one node's breaker while it goes to
// another: rueidis's own slot map follows a failover only up to a second
// later (it refreshes after a random delay), and until then it would send
// the promoted primary's keys to the dead one.
func (g *guard) route(rkey string) (*breaker.Breaker, rueidis.Client) {
	if g.mode == Cluster {
		if b, node := g.slots.route(keyslot.Of(rkey)); b != nil {
			return b, node
		}
	}
	return g.one, nil
}

// attach gives each primary of a new slot table its breaker: the one it
// had, or a new closed one. Breakers of nodes that are no longer
// primaries are dropped, and their state gauge with them.
func (g *guard) attach(t *slotTable) {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := *g.nodes.Load()
	next := make(map[string]*breaker.Breaker, len(t.addrs))
	t.brk = make([]*breaker.Breaker, len(t.addrs))
	for i, addr := range t.addrs {
		b := old[addr]
		if b == nil {
			b = newBreaker(addr, g.o)
		}
		next[addr] = b
		t.brk[i] = b
	}
	for addr, b := range old {
		if next[addr] == nil {
			metrics.UnregisterMetric(b.StateGauge())
		}
	}
	g.nodes.Store(&next)
}

// refreshSoon tells the guard that a call failed or was refused, or that
// the first connection was made: in Cluster mode the topology may have
// changed, so the slot map is refreshed soon. It does nothing in the
// other modes.
func (g *guard) refreshSoon() {
	if g.mode != Cluster {
		return
	}
	now := time.Now().UnixNano()
	last := g.lastKick.Load()
	if now-last < int64(slotRefreshGap) || !g.lastKick.CompareAndSwap(last, now) {
		return
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// call is the one way a call reaches Redis: through the circuit breaker
// b (the node's; refused at once while it is not closed, with its
// *breaker.OpenError), on node (the connection route picked with b) or
// else the rueidis client, within the call's deadline (callCtx, or
// batchCtx when batch is set), send makes the call, once no connection to
// b's node is being set up (dials: rueidis would make it wait for that
// beyond its deadline); b then counts send's
// error (see isFailure), and a failure asks for a fresh slot map. A call
// on node that meets a redirection (MOVED: the slot map is behind; ASK:
// the slot is being migrated) is made again on the rueidis client, which
// follows it; b counts the node's answer, not the call's outcome
// elsewhere. It returns send's error, or the refusal, or the error of a
// Client that has no connection (send is then not called).
// Single calls (exec) and each node's share of a batch (Store.Do) go
// through it; a batch's send follows the redirections of its ops itself
// (multiBuf.send).
func (c *Client) call(ctx context.Context, b *breaker.Breaker, node rueidis.Client, batch bool, send func(ctx context.Context, rc rueidis.Client) error) error {
	ticket, err := b.Pass()
	if err != nil {
		c.g.refreshSoon()
		return err
	}
	rc, err := c.client()
	counted := err
	switch {
	case err != nil:
	case batch:
		cctx, cancel := c.batchCtx(ctx)
		if err = c.dials.wait(cctx, c.dialKey(b, node)); err == nil {
			err, counted = c.route(cctx, rc, node, send)
		} else {
			counted = err
		}
		cancel()
	default:
		cctx := c.callDeadline(ctx)
		if err = c.dials.wait(cctx, c.dialKey(b, node)); err == nil {
			err, counted = c.route(cctx, rc, node, send)
		} else {
			counted = err
		}
		cctx.Stop()
	}
	c.done(b, ticket, counted)
	return err
}

// dialKey is the key of the connection a call through b on node needs,
// for dials.wait: b's name (its node's address; in Sentinel mode the
// primary's set-ups are counted under it too), or any address in Cluster
// mode when rueidis picks the node (node nil).
func (c *Client) dialKey(b *breaker.Breaker, node rueidis.Client) string {
	if c.o.Mode == Cluster && node == nil {
		return anyAddr
	}
	return b.Name()
}

// route runs send on node when there is one, and again on rc when node
// redirects it (see call); else on rc. It returns send's last error, and
// the error node's breaker counts: the same, or nil after a redirection
// (node answered; the call went on elsewhere).
func (c *Client) route(ctx context.Context, rc, node rueidis.Client, send func(ctx context.Context, rc rueidis.Client) error) (err, counted error) {
	if node == nil {
		err = send(ctx, rc)
		return err, err
	}
	err = send(ctx, node)
	if moved, ask := redirection(err); moved || ask {
		c.redirected(1, moved)
		return send(ctx, rc), nil
	}
	return err, err
}

// redirection reports whether err is a Cluster redirection, MOVED or
// ASK.
func redirection(err error) (moved, ask bool) {
	re, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false, false
	}
	_, moved = re.IsMoved()
	_, ask = re.IsAsk()
	return moved, ask
}

// redirected notes that n calls or ops sent on a node's connection met a
// redirection; after a MOVED the slot map is behind, so it is refreshed
// soon (an ASK says a slot is being migrated: the map is right).
func (c *Client) redirected(n int, moved bool) {
	c.redirects.Add(uint64(n))
	redirections.Add(n)
	if moved {
		c.g.refreshSoon()
	}
}

// exec runs script on rkey with args as one call (see call), through the
// breaker of rkey's node: the checks', leases' and heartbeats' scripts,
// and any other single call. A call that no other overlaps uses the
// direct connection when there is an open one (see directBusy).
func (c *Client) exec(ctx context.Context, script *rueidis.Lua, rkey string, args []string) (r rueidis.RedisResult, err error) {
	b, node := c.g.route(rkey)
	err = c.call(ctx, b, node, false, func(ctx context.Context, rc rueidis.Client) error {
		keys := []string{rkey}
		return c.single(rc, func(rc rueidis.Client) (connErr, err error) {
			r = script.Exec(ctx, rc, keys, args)
			return r.Error(), r.Error()
		})
	})
	return r, err
}

// single runs send, one single call, on the direct connection when the
// call may use it (takeDirect), else on rc, and notes the call's time
// (see directBusy). send returns the error that decides whether the
// direct connection is kept (putDirect: any but a Redis error reply
// drops it) and the call's error, which single returns.
func (c *Client) single(rc rueidis.Client, send func(rc rueidis.Client) (connErr, err error)) error {
	var err error
	if dc := c.takeDirect(); dc != nil {
		var connErr error
		connErr, err = send(dc)
		c.putDirect(connErr)
	} else {
		_, err = send(rc)
	}
	c.lastCall.Store(time.Now().UnixNano())
	return err
}

// done records the outcome err of a call that b allowed with ticket (b
// counts every call, to judge the share that fails), and asks for a
// refresh of the slot map when the call failed.
func (c *Client) done(b *breaker.Breaker, ticket breaker.Ticket, err error) {
	failed := err != nil && isFailure(err)
	b.Done(ticket, time.Now(), failed)
	if failed {
		c.g.refreshSoon()
		if b.State() != breaker.Closed {
			select { // the prober's next probe is due at a new time
			case c.g.opened <- struct{}{}:
			default:
			}
		}
	}
}

// probeTimeout bounds one probe: a PING, over a new connection when
// rueidis had to drop the old one. Probes are made in the background, so
// it may be longer than a check's Timeout.
func (c *Client) probeTimeout() time.Duration {
	return max(c.o.Timeout, minProbeTimeout)
}

// minProbeTimeout is the shortest probe timeout: a dial, the handshake
// and a PING on a loaded machine.
const minProbeTimeout = 100 * time.Millisecond

// probeLoop makes the probes of every breaker that is not closed, until
// c closes: as soon as a breaker's cool-down has passed, a PING to its
// node, then more until the breaker closes or opens again. Calls of the
// Store never probe (Breaker.Pass): while a node is out, no check waits
// on it, and the first check after it is back finds a connection made.
func (c *Client) probeLoop() {
	defer close(c.probeDone)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		wait := time.Hour
		if next := c.probeDue(time.Now()); !next.IsZero() {
			wait = max(time.Until(next), time.Millisecond)
		}
		t.Reset(wait)
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.g.opened:
		}
	}
}

// probeDue probes, concurrently, every breaker that is not closed and
// whose next probe may go at now, and returns the earliest time a probe
// is due next (zero when every breaker is closed).
func (c *Client) probeDue(now time.Time) time.Time {
	var wg sync.WaitGroup
	for _, b := range c.g.all() {
		if b.State() != breaker.Closed && !now.Before(b.RetryAt()) {
			wg.Go(func() { c.probe(b) })
		}
	}
	wg.Wait()
	var next time.Time
	for _, b := range c.g.all() {
		if r := b.RetryAt(); !r.IsZero() && (next.IsZero() || r.Before(next)) {
			next = r
		}
	}
	return next
}

// probe sends PINGs to b's node, each allowed by b as a probe, until b
// closes or opens again (or refuses: a probe is in flight).
func (c *Client) probe(b *breaker.Breaker) {
	for range 2*c.o.Breaker.Successes + 2 {
		ticket, err := b.Allow(time.Now())
		if err != nil {
			return
		}
		err = c.ping(b)
		b.Done(ticket, time.Now(), isFailure(err))
		if err != nil || b.State() != breaker.HalfOpen {
			return
		}
	}
}

// ping sends PING to the node b guards: in Cluster mode the primary b
// is named after (any node for the unmapped slots' breaker), else the
// server or primary. In Cluster mode it sends CLUSTER INFO instead, and
// fails unless cluster_state is ok: a node of a Cluster that is down
// answers PING but refuses every key with CLUSTERDOWN, and a breaker that
// closed on its PING would open again at the next check.
func (c *Client) ping(b *breaker.Breaker) error {
	rc, err := c.client()
	if err != nil {
		return err
	}
	if c.o.Mode == Cluster && b != c.g.one {
		node, ok := rc.Nodes()[b.Name()]
		if !ok {
			return fmt.Errorf("redisx: probe %s: %w", b.Name(), rueidis.ErrNoAddr)
		}
		rc = node
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.probeTimeout())
	defer cancel()
	if c.o.Mode != Cluster {
		return rc.Do(ctx, rc.B().Ping().Build()).Error()
	}
	info, err := rc.Do(ctx, rc.B().ClusterInfo().Build()).ToString()
	if err != nil {
		return err
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return fmt.Errorf("redisx: probe %s: %w", b.Name(), errClusterDown)
	}
	return nil
}

// all returns every breaker of g.
func (g *guard) all() []*breaker.Breaker {
	if g.mode != Cluster {
		return []*breaker.Breaker{g.one}
	}
	nodes := *g.nodes.Load()
	out := make([]*breaker.Breaker, 0, 1+len(nodes))
	out = append(out, g.one)
	for _, b := range nodes {
		out = append(out, b)
	}
	return out
}

// topologyLoop refreshes the slot map of c until c closes: at once, every
// slotRefreshEvery (every slotRefreshGap while a breaker is open), and
// when a failure kicks it (at most every slotRefreshGap).
func (c *Client) topologyLoop() {
	defer close(c.topoDone)
	t := time.NewTicker(slotRefreshEvery)
	defer t.Stop()
	for {
		if rc := c.rc.Load(); rc != nil {
			ctx, cancel := context.WithTimeout(context.Background(), slotRefreshTimeout)
			if err := c.g.slots.refresh(ctx, rc.Client); err != nil {
				slotRefreshErrors.Inc()
			}
			cancel()
		}
		// While a breaker is open its node gets no calls, so no failure
		// kicks a refresh: look for a promoted replica every gap.
		var soon <-chan time.Time
		if c.Degraded() {
			soon = time.After(slotRefreshGap)
		}
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.g.kick:
		case <-soon:
		}
		// Kicks closer than the gap wait for it: a burst of failures
		// costs one refresh.
		select {
		case <-c.stop:
			return
		case <-time.After(slotRefreshGap):
		}
	}
}

// BreakerStatus is the state of one circuit breaker of a Client.
type BreakerStatus struct {
	// Node is the breaker's name: the Redis node it guards (host:port),
	// "sentinel:<master set>" in Sentinel mode, or
	// "cluster:unmapped-slots" for the Cluster slots no known primary
	// serves.
	Node string
	// State is the breaker's state.
	State breaker.State
	// RetryAt is when the next probe may go (the zero time while
	// closed).
	RetryAt time.Time
}

// Breakers returns the state of every circuit breaker of c, sorted by
// node.
func (c *Client) Breakers() []BreakerStatus {
	all := c.g.all()
	out := make([]BreakerStatus, 0, len(all))
	for _, b := range all {
		out = append(out, BreakerStatus{Node: b.Name(), State: b.State(), RetryAt: b.RetryAt()})
	}
	slices.SortFunc(out, func(a, b BreakerStatus) int {
		switch {
		case a.Node < b.Node:
			return -1
		case a.Node > b.Node:
			return 1
		}
		return 0
	})
	return out
}

// Degraded reports whether any circuit breaker of c is not closed: some
// calls are refused or only probing.
func (c *Client) Degraded() bool {
	for _, b := range c.g.all() {
		if b.State() != breaker.Closed {
			return true
		}
	}
	return false
}

// RetryAt returns the earliest time a breaker of c that is not closed
// lets its next probe go (in the past while one is half-open), or the
// zero time when every breaker is closed.
func (c *Client) RetryAt() time.Time {
	var at time.Time
	for _, b := range c.g.all() {
		if r := b.RetryAt(); !r.IsZero() && (at.IsZero() || r.Before(at)) {
			at = r
		}
	}
	return at
}
