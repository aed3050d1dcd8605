package redisx

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
)

// dials tracks the connections being set up, by address. rueidis makes a
// call wait, whatever its context, while another goroutine (a refresh of
// its slot map, say) sets up the connection the call needs, which a paused
// node stretches to the dial timeout. A call first waits here, bounded by
// its own deadline, until no connection to its node is being set up.
type dials struct {
	// background counts the dials whose context never ends too. rueidis
	// re-dials a Cluster node's or a Sentinel primary's pipelined
	// connection with such a context from its refreshes; a single
	// server's (Standalone) are only its first connection and its
	// dedicated ones.
	background bool
	// key, when set, names the set-ups a dial's address and dialer
	// count under (Sentinel mode: the primary's, whatever its address),
	// or says not to count it (a sentinel's connection).
	key func(addr string, dialer *net.Dialer) (string, bool)
	// seen, when set, is told of every dial (tests).
	seen atomic.Pointer[func(ctx context.Context, addr string)]
	busy atomic.Int64 // set-ups in progress, all addresses
	mu   sync.Mutex
	m    map[string]*dialing
}

// dialing is the set-ups in progress to one address.
type dialing struct {
	n     int
	ready chan struct{} // closed when n falls to 0
}

// anyAddr is the key of every set-up, whatever its address: a call whose
// node rueidis picks waits on it.
const anyAddr = ""

// start notes a set-up to addr; the returned func ends it (once).
func (d *dials) start(addr string) func() {
	d.busy.Add(1)
	d.mu.Lock()
	if d.m == nil {
		d.m = make(map[string]*dialing)
	}
	one, all := d.enter(addr), d.enter(anyAddr)
	d.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			d.leave(addr, one)
			d.leave(anyAddr, all)
			d.mu.Unlock()
			d.busy.Add(-1)
		})
	}
}

// enter counts a set-up under key; d.mu is held.
func (d *dials) enter(key string) *dialing {
	st := d.m[key]
	if st == nil {
		st = &dialing{ready: make(chan struct{})}
		d.m[key] = st
	}
	st.n++
	return st
}

// leave ends a set-up counted under key; d.mu is held.
func (d *dials) leave(key string, st *dialing) {
	if st.n--; st.n == 0 {
		close(st.ready)
		delete(d.m, key)
	}
}

// wait returns when no connection to addr (to any address: anyAddr) is
// being set up, or with ctx's error when ctx ends first. With no set-up
// anywhere it takes no lock.
func (d *dials) wait(ctx context.Context, addr string) error {
	if d.busy.Load() == 0 {
		return nil
	}
	d.mu.Lock()
	st := d.m[addr]
	d.mu.Unlock()
	if st == nil {
		return nil
	}
	select {
	case <-st.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dedicatedDial marks the context of a call whose dial sets up a
// dedicated connection (a subscription's): no check uses it, so no check
// waits for it.
type dedicatedDial struct{}

// withDedicatedDial returns ctx marked as a dedicated connection's.
func withDedicatedDial(ctx context.Context) context.Context {
	return context.WithValue(ctx, dedicatedDial{}, true)
}

// dialFn returns a rueidis DialCtxFn that dials with the dialer rueidis
// passes and counts the set-up as in progress from the dial until the
// first bytes come back on the connection (the answer to rueidis's
// handshake) or it closes. rueidis dials with the context of the call
// that needs the connection, or one that never ends (its refreshes, its
// first connection, and a dedicated connection outside Cluster mode).
// Not counted: a dedicated connection's marked so (dedicatedDial: a
// subscription's, in Cluster mode), and without background a dial whose
// context never ends. With the default of one pipelined connection per
// node, a set-up counted is that of the connection every call to the
// node uses (or, in Sentinel mode, a subscription's to the primary,
// which a healthy primary sets up in a round trip).
func (d *dials) dialFn() func(ctx context.Context, addr string, dialer *net.Dialer, tc *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, addr string, dialer *net.Dialer, tc *tls.Config) (net.Conn, error) {
		if seen := d.seen.Load(); seen != nil {
			(*seen)(ctx, addr)
		}
		if ctx.Done() == nil && !d.background || ctx.Value(dedicatedDial{}) != nil {
			return dial(ctx, addr, dialer, tc)
		}
		key := addr
		if d.key != nil {
			var track bool
			if key, track = d.key(addr, dialer); !track {
				return dial(ctx, addr, dialer, tc)
			}
		}
		end := d.start(key)
		conn, err := dial(ctx, addr, dialer, tc)
		if err != nil {
			end()
			return nil, err
		}
		return &settingUp{Conn: conn, end: end}, nil
	}
}

// dial dials addr with dialer, through TLS when tc is set.
func dial(ctx context.Context, addr string, dialer *net.Dialer, tc *tls.Config) (net.Conn, error) {
	if tc != nil {
		return (&tls.Dialer{NetDialer: dialer, Config: tc}).DialContext(ctx, "tcp", addr)
	}
	return dialer.DialContext(ctx, "tcp", addr)
}

// settingUp is a connection whose set-up ends at its first read of any
// bytes, or at its close.
type settingUp struct {
	net.Conn
	done atomic.Bool
	end  func()
}

// Read reads from the connection; the first bytes read end the set-up.
func (c *settingUp) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if (n > 0 || err != nil) && !c.done.Load() && c.done.CompareAndSwap(false, true) {
		c.end()
	}
	return n, err
}

// Close closes the connection and ends its set-up.
func (c *settingUp) Close() error {
	if c.done.CompareAndSwap(false, true) {
		c.end()
	}
	return c.Conn.Close()
}
