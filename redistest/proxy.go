package redistest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"
)

// proxyChunk is the most a Proxy reads, and then forwards, at once.
const proxyChunk = 16 << 10

// Proxy is a TCP proxy for fault tests, put between the code under test
// and a real server: it forwards faithfully until told to blackhole,
// delay, drop or refuse. Its methods are safe for concurrent use. Start it
// with StartProxy.
type Proxy struct {
	target string
	l      net.Listener
	ctx    context.Context // done when the proxy closes
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the proxy

	mu        sync.Mutex
	blackhole bool
	delay     time.Duration
	refuse    bool
	changed   chan struct{}      // closed and replaced when the three above change
	links     map[*link]struct{} // the open connections
	closed    bool
}

// link is one proxied connection: the accepted client side and the
// server side dialled for it.
type link struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
}

// close closes both sides, with an RST when reset is true.
func (lk *link) close(reset bool) {
	lk.once.Do(func() {
		close(lk.done)
		for _, c := range []net.Conn{lk.client, lk.server} {
			if tc, ok := c.(*net.TCPConn); ok && reset {
				tc.SetLinger(0)
			}
			c.Close()
		}
	})
}

// StartProxy listens on 127.0.0.1:0 and forwards every connection to
// target. It is closed, with every connection, when t ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy to %s: %v", target, err)
	}
	p := &Proxy{target: target, l: l, changed: make(chan struct{}), links: make(map[*link]struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr returns the address the proxy listens on.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Blackhole stops forwarding in both directions while keeping every
// connection open, as a server stopped with SIGSTOP would: what is sent is
// held, not lost. New connections are accepted but get nothing.
func (p *Proxy) Blackhole() { p.set(func() { p.blackhole = true }) }

// Delay adds d of latency to every chunk forwarded, in each direction; 0
// removes it. A chunk read at time T is forwarded at T+d, so that
// pipelined chunks are delayed by d each, not by d times their number.
func (p *Proxy) Delay(d time.Duration) { p.set(func() { p.delay = max(d, 0) }) }

// Refuse makes the proxy close new connections at once, with an RST, while
// on is true. Open connections are not affected.
func (p *Proxy) Refuse(on bool) { p.set(func() { p.refuse = on }) }

// Heal returns to normal forwarding: no blackhole, no delay, new
// connections accepted. Data held by a blackhole or a delay is then
// forwarded, in order.
func (p *Proxy) Heal() {
	p.set(func() { p.blackhole, p.delay, p.refuse = false, 0, false })
}

// Drop resets every open connection, both sides (SetLinger(0), then
// Close). New connections are accepted as before.
func (p *Proxy) Drop() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for lk := range p.links {
		links = append(links, lk)
	}
	p.mu.Unlock()
	for _, lk := range links {
		lk.close(true)
	}
}

// set changes the proxy's mode with change and wakes the forwarders.
func (p *Proxy) set(change func()) {
	p.mu.Lock()
	change()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// close stops the proxy, closes every connection and waits until every
// goroutine of the proxy has returned.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	p.l.Close()
	p.Drop()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return // closed; a test proxy need not survive EMFILE
		}
		p.mu.Lock()
		refuse := p.closed || p.refuse
		if !refuse {
			p.wg.Add(1)
		}
		p.mu.Unlock()
		if refuse {
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			continue
		}
		go p.serve(c)
	}
}

// serve dials the target for client c and forwards between them until
// either side closes.
func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	var d net.Dialer
	s, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
		return
	}
	lk := &link{client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		lk.close(true)
		return
	}
	p.links[lk] = struct{}{}
	p.mu.Unlock()

	var wg sync.WaitGroup
	for _, dir := range [][2]net.Conn{{c, s}, {s, c}} {
		q := make(chan proxied, 16)
		wg.Go(func() { p.read(lk, dir[0], q) })
		wg.Go(func() { p.write(lk, dir[1], q) })
	}
	wg.Wait()
	p.mu.Lock()
	delete(p.links, lk)
	p.mu.Unlock()
}

// proxied is a chunk read, with when it was read.
type proxied struct {
	b  []byte
	at time.Time
}

// read queues what src sends until src ends or lk closes.
func (p *Proxy) read(lk *link, src net.Conn, q chan<- proxied) {
	defer close(q)
	for {
		b := make([]byte, proxyChunk)
		n, err := src.Read(b)
		if n > 0 {
			select {
			case q <- proxied{b[:n], time.Now()}:
			case <-lk.done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// write forwards the chunks of q to dst, each when the mode lets it go,
// and closes lk when q ends (after forwarding what the other side sent
// before closing) or a write fails.
func (p *Proxy) write(lk *link, dst net.Conn, q <-chan proxied) {
	defer lk.close(false)
	for c := range q {
		if !p.hold(lk, c.at) {
			return
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// hold waits until a chunk read at time at may be forwarded: no
// blackhole, and the delay since at has passed. It returns false when lk
// closes first.
func (p *Proxy) hold(lk *link, at time.Time) bool {
	for {
		p.mu.Lock()
		blackhole, delay, changed := p.blackhole, p.delay, p.changed
		p.mu.Unlock()
		var timer *time.Timer
		var fire <-chan time.Time
		if !blackhole {
			wait := time.Until(at.Add(delay))
			if wait <= 0 {
				return true
			}
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case <-fire:
			return true
		case <-changed:
		case <-lk.done:
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-lk.done:
			return false
		default:
		}
	}
}
