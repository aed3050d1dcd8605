package redisx

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/breaker"
	"github.com/rld/rld/deadline"
)

// Mode says how Redis is deployed.
type Mode string

// Modes.
const (
	// Standalone is one Redis server at Options.Addrs[0].
	Standalone Mode = "standalone"
	// Sentinel finds the primary named Options.MasterSet through the
	// sentinels at Options.Addrs.
	Sentinel Mode = "sentinel"
	// Cluster is a Redis Cluster reached through the seed nodes at
	// Options.Addrs.
	Cluster Mode = "cluster"
)

// Defaults of Options.
const (
	// DefaultTimeout bounds every call: a check never waits longer on
	// Redis. It is deadline.DefaultStore, shardcache's default too.
	DefaultTimeout = deadline.DefaultStore
	// DefaultDialTimeout bounds the set-up of one connection.
	DefaultDialTimeout = 500 * time.Millisecond
	// DefaultWriteTimeout is how long a connection may go without an
	// answer to what it sent before rueidis closes it (rueidis's
	// ConnWriteTimeout, 10 s by default).
	DefaultWriteTimeout = 500 * time.Millisecond
)

// Reconnection back-off while no connection has ever been made.
const (
	reconnectMin = 50 * time.Millisecond
	reconnectMax = 2 * time.Second
)

// Errors.
var (
	// ErrNotConnected is returned by calls made before the Client first
	// reached Redis. The error wraps the last connection error.
	ErrNotConnected = errors.New("redisx: not connected to redis")
	// ErrClosed is returned by calls on a closed Client.
	ErrClosed = errors.New("redisx: client closed")
	// errNotSocket: a dialled connection is not a socket.
	errNotSocket = errors.New("redisx: connection is not a socket")
)

// Options configures a Client. The zero value of each field but Addrs
// means its default.
type Options struct {
	// Addrs are host:port addresses: the server (Standalone), the
	// sentinels (Sentinel) or seed nodes (Cluster).
	Addrs []string
	// Mode is Standalone (the default), Sentinel or Cluster.
	Mode Mode
	// MasterSet names the primary the sentinels watch (Sentinel only,
	// required there).
	MasterSet string
	// Username and Password authenticate to the Redis servers (not to
	// the sentinels).
	Username, Password string
	// TLS, when set, connects to the servers and the sentinels with TLS.
	// Calls then all go through the pipeline (see takeDirect).
	TLS *tls.Config
	// KeyPrefix starts every key the Store writes. Unlike the other
	// fields, "" is taken as it is: no prefix.
	KeyPrefix string
	// Timeout bounds every call (DefaultTimeout).
	Timeout time.Duration
	// DialTimeout bounds the set-up of one connection
	// (DefaultDialTimeout).
	DialTimeout time.Duration
	// WriteTimeout closes a connection whose answers are this late
	// (DefaultWriteTimeout).
	WriteTimeout time.Duration
	// PipelineMultiplex is log2 of the connections per Redis server that
	// calls are pipelined over (rueidis's default when 0: 2 connections
	// on this machine for Standalone and Sentinel, 1 for Cluster).
	PipelineMultiplex int
	// MaxFlushDelay lets rueidis wait up to this long after a write to
	// gather more calls into the next one: less CPU, more latency. 0 (the
	// default) writes at once.
	MaxFlushDelay time.Duration
	// Breaker configures the circuit breakers every call goes through:
	// one for the deployment in Standalone and Sentinel mode, one per
	// primary in Cluster mode (see Client). Its zero fields mean their
	// defaults.
	Breaker breaker.Options
}

func (o Options) withDefaults() (Options, error) {
	if len(o.Addrs) == 0 {
		return o, errors.New("redisx: no redis address")
	}
	if o.Mode == "" {
		o.Mode = Standalone
	}
	switch o.Mode {
	case Standalone:
		if len(o.Addrs) != 1 {
			return o, fmt.Errorf("redisx: standalone mode takes one address, got %d", len(o.Addrs))
		}
	case Sentinel:
		if o.MasterSet == "" {
			return o, errors.New("redisx: sentinel mode needs a master set")
		}
	case Cluster:
	default:
		return o, fmt.Errorf("redisx: unknown mode %q", o.Mode)
	}
	if o.MasterSet != "" && o.Mode != Sentinel {
		return o, fmt.Errorf("redisx: master set %q given in %s mode", o.MasterSet, o.Mode)
	}
	if strings.ContainsAny(o.KeyPrefix, "{}") {
		return o, fmt.Errorf("redisx: key prefix %q contains { or }", o.KeyPrefix)
	}
	if o.PipelineMultiplex < 0 || o.PipelineMultiplex > rueidis.MaxPipelineMultiplex {
		return o, fmt.Errorf("redisx: pipeline multiplex %d not in 0..%d", o.PipelineMultiplex, rueidis.MaxPipelineMultiplex)
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	o.Breaker = o.Breaker.WithDefaults()
	o.Addrs = append([]string(nil), o.Addrs...)
	return o, nil
}

// rueidisOption is the rueidis configuration of o: fail fast, no cache,
// auto-pipelining.
func (o *Options) rueidisOption() rueidis.ClientOption {
	ro := rueidis.ClientOption{
		InitAddress:      o.Addrs,
		Username:         o.Username,
		Password:         o.Password,
		TLSConfig:        o.TLS,
		ClientName:       "rld",
		Dialer:           net.Dialer{Timeout: o.DialTimeout},
		ConnWriteTimeout: o.WriteTimeout,
		DisableCache:     true, // rld's cache is its own
		DisableRetry:     true, // an increment must never apply twice
		// Keep a reader on every connection even when calls are not
		// concurrent: a connection that Redis closed (a restart) is then
		// noticed at once, not by the first call after Redis is back.
		AlwaysPipelining:  true,
		PipelineMultiplex: o.PipelineMultiplex,
		MaxFlushDelay:     o.MaxFlushDelay,
	}
	switch o.Mode {
	case Standalone:
		ro.ForceSingleClient = true
	case Sentinel:
		ro.Sentinel = rueidis.SentinelOption{
			MasterSet: o.MasterSet,
			TLSConfig: o.TLS,
			// Go's default keep-alive, spelled out: it tells a sentinel's
			// dial from the primary's (Client.dials).
			Dialer: net.Dialer{Timeout: o.DialTimeout, KeepAliveConfig: net.KeepAliveConfig{
				Enable: true, Idle: 15 * time.Second, Interval: 15 * time.Second, Count: 9}},
			// Reconcile with the sentinels now and then: a missed
			// +switch-master would otherwise pin the old primary.
			TopologyRefreshInterval: 5 * time.Second,
		}
	case Cluster:
		// Calls go to the primary of rld's own slot map (guard.route);
		// rueidis's map routes only the calls made again after a
		// redirection and those of a slot map too old to trust
		// (nodeTrust). rueidis refreshes it after an error only after a
		// random delay of up to a second; a scan of its own every
		// clusterScanEvery (one CLUSTER SHARDS) bounds how long it sends
		// those calls to a dead primary after a failover.
		ro.ClusterOption = rueidis.ClusterOption{ShardsRefreshInterval: clusterScanEvery}
	}
	return ro
}

// clusterScanEvery is how often the rueidis Cluster client rescans the
// topology on its own.
const clusterScanEvery = 200 * time.Millisecond

// Client is a connection to one Redis deployment. It is safe for
// concurrent use. Create it with New; Close it when done.
//
// Every call of the Store goes through a circuit breaker (package breaker):
// in Standalone and Sentinel mode one breaker guards the deployment (the
// server, or the primary the sentinels name); in Cluster mode each
// primary has its own, picked by the key's slot in a slot map that the
// Client refreshes every second and soon after a call fails, and the
// slots no known primary serves share one more. While a key's breaker is
// open its calls are not sent: they fail at once with a
// *breaker.OpenError (wrapping breaker.ErrOpen) that says when the next
// probe may go. Probes are PINGs that the Client sends in the background
// once a breaker's cool-down has passed, never calls of the Store: no
// check waits on a node that may still be down. Breakers and Degraded
// report the breakers' states.
type Client struct {
	o  Options
	rc atomic.Pointer[rueidisClient] // nil until the first connection
	g  *guard

	lastErr atomic.Pointer[error] // the last connection error, while rc is nil
	dials   dials                 // rc's connections being set up

	// direct is the unpipelined connection of uncontended single calls
	// (Standalone only); lastCall is when the last single call ended
	// (unix ns), on either path.
	direct      direct
	lastCall    atomic.Int64
	directCalls atomic.Uint64 // single calls that went direct, for tests
	redirects   atomic.Uint64 // calls and ops redirected off the slot map's node, for tests

	stop      chan struct{} // closed by Close
	loopDone  chan struct{} // closed when the connect loop has returned
	topoDone  chan struct{} // closed when the topology loop has returned (Cluster)
	probeDone chan struct{} // closed when the prober has returned
	closeOnce sync.Once
}

// rueidisClient boxes the interface for atomic.Pointer.
type rueidisClient struct{ rueidis.Client }

// New returns a Client for o and makes its first connection.
//
// A Redis that cannot be reached is not an error: New returns a Client
// that keeps connecting in the background (calls fail at once with an
// error wrapping ErrNotConnected until it has), so a daemon can start
// while Redis is down and follow its rules' failure modes. Use Ping to
// learn whether Redis answers. New fails on invalid options and when
// Redis itself refuses the connection (a wrong password, say), which no
// waiting will fix. New waits for the first attempt at most until ctx is
// done; the attempt then goes on in the background.
func New(ctx context.Context, o Options) (*Client, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Client{o: o, g: newGuard(o), stop: make(chan struct{}), loopDone: make(chan struct{}), probeDone: make(chan struct{})}
	first := make(chan error, 1)
	go c.connectLoop(first)
	go c.probeLoop()
	if o.Mode == Cluster {
		c.topoDone = make(chan struct{})
		go c.topologyLoop()
	}
	select {
	case err := <-first:
		if isRefusal(err) || isTLSMismatch(err) {
			c.Close()
			if o.Mode == Sentinel && strings.Contains(err.Error(), "unknown command 'SENTINEL'") {
				return nil, fmt.Errorf("redisx: %s is not a sentinel (it does not know SENTINEL): name the sentinels, or set the mode to standalone: %w", strings.Join(o.Addrs, ","), err)
			}
			return nil, fmt.Errorf("redisx: redis %s refused the connection: %w", strings.Join(o.Addrs, ","), err)
		}
	case <-ctx.Done():
	}
	return c, nil
}

// isRefusal reports whether err is Redis refusing the client (an error
// reply such as WRONGPASS or NOPERM), not a network failure.
func isRefusal(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

// isTLSMismatch reports whether err is a TLS handshake that cannot
// succeed by waiting: a certificate the client does not trust (or that
// names another server), or a server that does not speak TLS.
func isTLSMismatch(err error) bool {
	var cert *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	return errors.As(err, &cert) || errors.As(err, &record)
}

// connectLoop makes the first connection, backing off between tries,
// until it succeeds or the Client closes. The first try's error (nil on
// success) goes to first.
func (c *Client) connectLoop(first chan<- error) {
	defer close(c.loopDone)
	wait := reconnectMin
	c.dials.background = c.o.Mode != Standalone
	if c.o.Mode == Sentinel {
		// The sentinels' dialer is told apart by its keep-alive
		// settings (the same as Go's defaults, spelled out); every
		// other dial is the primary's (or a replica's).
		primary := c.g.one.Name()
		c.dials.key = func(_ string, dialer *net.Dialer) (string, bool) {
			return primary, !dialer.KeepAliveConfig.Enable
		}
	}
	for {
		ro := c.o.rueidisOption()
		ro.DialCtxFn = c.dials.dialFn()
		rc, err := rueidis.NewClient(ro)
		if rc != nil {
			// With ForceSingleClient (standalone), rueidis returns a
			// client even when the dial failed; it dials again on the
			// next call.
			c.rc.Store(&rueidisClient{rc})
			c.g.refreshSoon() // Cluster: map the slots at once
			go c.preloadScripts(rc)
		}
		if err != nil {
			c.lastErr.Store(&err)
			connectErrors.Inc()
		}
		if first != nil {
			first <- err
			first = nil
		}
		if rc != nil {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-c.stop:
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, reconnectMax)
	}
}

// client returns the rueidis client, or an error when there is none yet.
func (c *Client) client() (rueidis.Client, error) {
	select {
	case <-c.stop:
		return nil, ErrClosed
	default:
	}
	if rc := c.rc.Load(); rc != nil {
		return rc.Client, nil
	}
	if p := c.lastErr.Load(); p != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotConnected, *p)
	}
	return nil, ErrNotConnected
}

// callCtx returns the context of one call: ctx's values and deadline,
// with the deadline at most Timeout away. The cancellation of ctx is not
// followed: a call lasts at most Timeout anyway, and a daemon that drains
// after its context ended must still answer the checks it has read. Its
// timer is armed only when rueidis waits on it (a pipelined call): a
// direct call only sets the deadline on its connection.
func (c *Client) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	dc := c.callDeadline(ctx)
	return dc, dc.Stop
}

// callDeadline is callCtx without the cancel function; call its Stop.
func (c *Client) callDeadline(ctx context.Context) *deadline.Context {
	return deadline.Detached(ctx, time.Now().Add(c.o.Timeout))
}

// batchCtx returns the context of one batch (Store.Do): ctx's values,
// and ctx's deadline when it has one, else the Timeout. The cancellation
// of ctx is not followed, as in callCtx: ops that are read are answered.
func (c *Client) batchCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return c.callCtx(ctx)
	}
	return context.WithDeadline(context.WithoutCancel(ctx), dl)
}

// Ping sends PING (to one node in Cluster mode) under the call deadline.
func (c *Client) Ping(ctx context.Context) error {
	rc, err := c.client()
	if err != nil {
		return err
	}
	ctx, cancel := c.callCtx(ctx)
	defer cancel()
	if err := rc.Do(ctx, rc.B().Ping().Build()).Error(); err != nil {
		return fmt.Errorf("redisx: ping %s: %w", strings.Join(c.o.Addrs, ","), err)
	}
	return nil
}

// ServerMode returns the redis_mode that INFO server reports (standalone,
// cluster or sentinel) of the server c reaches (one node in Cluster
// mode), under the call deadline.
func (c *Client) ServerMode(ctx context.Context) (string, error) {
	rc, err := c.client()
	if err != nil {
		return "", err
	}
	ctx, cancel := c.callCtx(ctx)
	defer cancel()
	info, err := rc.Do(ctx, rc.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("redisx: info server: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_mode:"); ok {
			return v, nil
		}
	}
	return "", errors.New("redisx: info server: no redis_mode")
}

// Options returns the options of c with the defaults filled in.
func (c *Client) Options() Options {
	o := c.o
	o.Addrs = append([]string(nil), o.Addrs...)
	return o
}

// Close closes the connections; calls after it fail with ErrClosed. It
// is safe to call more than once.
func (c *Client) Close() {
	c.closeOnce.Do(func() {
		close(c.stop)
		<-c.loopDone
		if c.topoDone != nil {
			<-c.topoDone
		}
		<-c.probeDone
		if rc := c.rc.Load(); rc != nil {
			rc.Close()
		}
		c.direct.close()
	})
}

// A single call (exec, or a Store.Do of one op) that no other single
// call of the Client overlaps goes, in Standalone mode on Linux, over a
// connection of its own
// without pipelining: the calling goroutine writes the command and reads
// the reply itself. Through rueidis's pipeline, a call is handed to the
// connection's writer goroutine and its reply back from the reader
// goroutine, and those two hand-offs, each a wake-up of a thread, cost
// more CPU than the rest of a strict check (docs/performance.md).
// Concurrent calls still share the pipeline: only the call that finds
// the direct connection free uses it.
//
// A connection without a reader goroutine does not see Redis close it (a
// restart, a proxy's reset, Redis's idle timeout) until it is used, so
// each direct call first peeks at the socket without blocking (one
// recvfrom, MSG_PEEK): a connection whose peer has closed or reset it, or
// that holds unread bytes, is closed, and the call goes through the
// pipeline, whose reader has seen the close. A new direct connection is
// dialled in the background when single calls come at least every
// directBusy, and one is dropped after a call fails other than by a
// Redis error reply (a timeout, a broken connection). Otherwise the
// failure semantics are the pipeline's: the same breaker, deadline and
// single attempt.
const directBusy = 100 * time.Millisecond

// directClientName is the name of the direct connections in Redis's
// CLIENT LIST; the pipelined ones are named rld.
const directClientName = "rld-direct"

// Sizes of the direct connections' rueidis buffers: a ring of
// 2^directRingScale calls, and read and write buffers of directBufSize.
const (
	directRingScale = 1
	directBufSize   = 16 << 10
)

// direct holds the direct connection of a Client.
type direct struct {
	// mu is held by the call that uses dc, or by the goroutine that
	// replaces it: a call that cannot take it uses the pipeline.
	mu     sync.Mutex
	sc     rueidis.Client          // the client dc comes from; guarded by mu
	dc     rueidis.DedicatedClient // nil when none; guarded by mu
	sock   *socket                 // dc's socket; guarded by mu
	client rueidis.Client          // dc as a rueidis.Client (directClient); guarded by mu
	closed bool                    // the Client is closed; guarded by mu

	// dialed is the socket sc dialled last (see dialDirect).
	dialed atomic.Pointer[socket]
}

// directClient lets rueidis.Lua.Exec and the Store's single calls, which
// take a rueidis.Client, send on a dedicated connection: they use Do,
// DoMulti and B, and Nodes (which stays the pipelined client's: where
// Do loads a lost script).
type directClient struct {
	rueidis.Client // the one dc comes from
	dc             rueidis.DedicatedClient
}

func (d directClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return d.dc.Do(ctx, cmd)
}

func (d directClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	return d.dc.DoMulti(ctx, cmds...)
}

func (d directClient) B() rueidis.Builder { return d.dc.B() }

// takeDirect returns the direct connection, held, when the call may use
// it, and nil when the call must go through the pipeline. A held
// connection is given back with putDirect.
func (c *Client) takeDirect() rueidis.Client {
	d := &c.direct
	// Not over TLS: the peek sees the socket's bytes, not the records'.
	if !peekSupported || c.o.Mode != Standalone || c.o.TLS != nil || !d.mu.TryLock() {
		return nil
	}
	if d.dc != nil && d.sock.open() {
		c.directCalls.Add(1)
		return d.client
	}
	// None, or closed by Redis: this call goes through the pipeline, and
	// the connection is replaced in the background if calls keep coming.
	stale := d.dc
	d.dc, d.sock, d.client = nil, nil, nil
	busy := time.Now().UnixNano()-c.lastCall.Load() <= int64(directBusy)
	if stale == nil && (!busy || d.closed) {
		d.mu.Unlock()
		return nil
	}
	go func() {
		defer d.mu.Unlock()
		if stale != nil {
			stale.Close()
		}
		if busy && !d.closed {
			c.dialDirect()
		}
	}()
	return nil
}

// putDirect gives back the direct connection after a call that ended
// with err; it drops the connection unless the call succeeded or Redis
// answered it with an error reply.
func (c *Client) putDirect(err error) {
	d := &c.direct
	if _, redisErr := rueidis.IsRedisErr(err); err != nil && !redisErr {
		d.dc.Close()
		d.dc, d.sock, d.client = nil, nil, nil
	}
	d.mu.Unlock()
}

// dialDirect makes the direct connection, with d.mu held.
func (c *Client) dialDirect() {
	d := &c.direct
	if d.sc == nil {
		o := c.o.rueidisOption()
		o.AlwaysPipelining = false
		o.PipelineMultiplex = -1 // one connection besides the dedicated one
		// Nothing is pipelined and replies are small: the default ring of
		// 1024 calls and 0.5 MiB buffers per connection would be made for
		// nothing (and take milliseconds of CPU to make).
		o.RingScaleEachConn = directRingScale
		o.ReadBufferEachConn, o.WriteBufferEachConn = directBufSize, directBufSize
		// rueidis PINGs a connection idle for Dialer.KeepAlive from a
		// goroutine of its own, and a call that meets such a PING puts
		// the connection in pipelined mode for good: no PINGs (a
		// negative KeepAlive). The peek before each call sees a closed
		// connection; the socket keeps the kernel's keep-alive (dialer).
		o.Dialer.KeepAlive = -1
		o.ClientName = directClientName
		dialer := net.Dialer{Timeout: c.o.DialTimeout}
		o.DialCtxFn = func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
			conn, err := dialer.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			s, err := newSocket(conn)
			if err != nil {
				conn.Close()
				return nil, err
			}
			d.dialed.Store(s)
			return conn, nil
		}
		sc, err := rueidis.NewClient(o)
		if err != nil {
			if sc != nil {
				sc.Close()
			}
			return
		}
		d.sc = sc
	}
	d.dialed.Store(nil)
	dc, _ := d.sc.Dedicate() // dials: the pool holds no open connection
	ctx, cancel := context.WithTimeout(context.Background(), c.o.DialTimeout)
	defer cancel()
	s := d.dialed.Load()
	if err := dc.Do(ctx, dc.B().Ping().Build()).Error(); err != nil || s == nil {
		dc.Close()
		return
	}
	d.dc, d.sock, d.client = dc, s, directClient{Client: d.sc, dc: dc}
}

// close closes the direct connection and its client, waiting for a call
// or a dial in progress.
func (d *direct) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.dc != nil {
		d.dc.Close()
		d.dc, d.sock, d.client = nil, nil, nil
	}
	if d.sc != nil {
		d.sc.Close()
		d.sc = nil
	}
}

// preloadScripts loads the checks' scripts (each algorithm's, and its
// once variant) on every node rc knows (a Cluster's primaries), again
// every second until every node took them or c closes: else the first check on a node that never
// saw them (a new Redis, one restarted or flushed) spends its deadline on
// EVALSHA, NOSCRIPT and EVAL, and is answered by its fail mode. A node
// that loses them later, or a replica promoted, meets the same NOSCRIPT
// path.
func (c *Client) preloadScripts(rc rueidis.Client) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), c.o.DialTimeout+time.Second)
		err := loadAllScripts(ctx, rc)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-c.stop:
			return
		case <-time.After(time.Second):
		}
	}
}

// loadAllScripts sends SCRIPT LOAD of every check script to every node
// rc knows, one pipeline per node on a dedicated connection (the calls of
// the checks do not queue behind it), and returns the first error.
func loadAllScripts(ctx context.Context, rc rueidis.Client) error {
	ctx = withDedicatedDial(ctx) // no check waits for its set-up
	var all [algo.NumKinds]bool
	for k := range all {
		all[k] = true
	}
	nodes := rc.Nodes()
	errs := make(chan error, len(nodes))
	for _, n := range nodes {
		go func() {
			errs <- n.Dedicated(func(dc rueidis.DedicatedClient) error {
				for _, r := range dc.DoMulti(ctx, scriptLoads(dc.B(), &all, &all)...) {
					if err := r.Error(); err != nil {
						return err
					}
				}
				return nil
			})
		}()
	}
	var first error
	for range nodes {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}
