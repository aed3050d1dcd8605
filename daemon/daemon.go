// Package daemon runs rld: it loads and reloads the configuration, listens
// on the Unix socket and the HTTP address, serves checks, and drains on
// shutdown.
package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rld/rld/buildinfo"
	"github.com/rld/rld/changestore"
	"github.com/rld/rld/config"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
	"github.com/rld/rld/region"
)

// Options are the command line's overrides of the configuration file.
type Options struct {
	// ConfigPath is the rld.toml to load and reload.
	ConfigPath string
	// Socket, when set, replaces server.socket.
	Socket string
	// HTTP, when non-nil, replaces server.http ("" disables HTTP).
	HTTP *string
	// AdminHTTP, when non-nil, replaces admin.http ("" disables it).
	AdminHTTP *string
	// Logger receives the daemon's logs; nil means one built from the
	// configuration's log_level and log_format on stderr.
	Logger *slog.Logger
	// Reload, when set, makes Run reload the configuration for every value
	// received. The command line registers SIGHUP on it before the first
	// load, so a reload sent during start-up is not fatal.
	Reload <-chan os.Signal
}

// Daemon is one rld process's server. Create it with New, then call Run.
type Daemon struct {
	opts   Options
	log    *slog.Logger
	stores policy.Stores
	mem    *memstore.Store // the embedded store; nil with Redis
	redis  *redisx.Client  // nil without Redis
	tops   *redisx.Tops    // where the fleet's heavy hitters are published; nil without Redis
	fleet  *fleet          // the cache and heartbeats on Redis; nil without
	region *region.Region  // the daemon's part in its region; nil without [global]
	// redisSilent: Redis did not answer at start; the daemon serves at
	// once and loads the overrides and blocks when it does.
	redisSilent bool

	// live is the configuration in force and what is built from it: a
	// reload swaps it as one pointer (see inForce).
	live atomic.Pointer[inForce]

	reloadMu   sync.Mutex // serialises reloads and changes; guards lastConfig and failedConfig
	lastConfig []byte
	// failedConfig is the ConfigHash of the content whose reload failed
	// last, "" when the last reload did not fail: the poll does not try
	// it again, and a file back at the content in force clears it.
	failedConfig string
	configPolls  atomic.Int64      // the config file's polls so far (tests wait on it)
	chStore      changestore.Store // the overrides and blocks (changes.go)
	autoBl       autoBlocks        // the automatic blocks' queue (penalty.go)
	compiles     atomic.Int64      // policies compiled for a change of the overrides and blocks

	draining atomic.Bool
	ready    chan struct{}
	ln       *net.UnixListener
	httpLn   net.Listener
	httpSrv  *fasthttp.Server
	// httpSockLn is server.http_socket's listener; trust is
	// server.trusted_proxies (both fixed at start).
	httpSockLn *net.UnixListener
	trust      derive.Proxies
	envoy      *envoyFace // [envoy]; nil when off (envoy.go)

	ops opsState // config hash, decision log, admin API

	connsMu sync.Mutex // guards conns
	conns   map[*net.UnixConn]struct{}
	nconns  atomic.Int64
	connWG  sync.WaitGroup
}

// New loads the configuration and builds the daemon's store and policy.
// It does not listen yet.
func New(opts Options) (*Daemon, error) {
	data, err := os.ReadFile(opts.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("cannot read config: %w", err)
	}
	cfg, err := config.Parse(data, opts.ConfigPath)
	if err != nil {
		return nil, err
	}
	applyOverrides(cfg, opts)
	log := opts.Logger
	if log == nil {
		log, err = newLogger(cfg.Server.LogLevel, cfg.Server.LogFormat)
		if err != nil {
			return nil, err
		}
	}
	trust, err := derive.ParseProxies(cfg.Server.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", opts.ConfigPath, err)
	}
	d := &Daemon{
		opts:       opts,
		log:        log,
		ready:      make(chan struct{}),
		conns:      make(map[*net.UnixConn]struct{}),
		lastConfig: data,
		trust:      trust,
	}
	if err := d.openStore(&cfg.Store); err != nil {
		return nil, err
	}
	if err := d.openRegion(cfg); err != nil {
		d.closeStore()
		return nil, err
	}
	// The penalty state outlives reloads and changes; it is bounded as
	// the embedded store's keys are.
	d.stores.Penalties = policy.NewPenalties(cfg.Store.MaxKeys, d.autoBlock)
	// So does the record of the leases settled: a lease acquired before
	// a reload is settled once after it.
	d.stores.Leases = policy.NewLeases()
	p, err := policy.Compile(cfg, nil, d.stores)
	if err != nil {
		d.closeStore()
		return nil, fmt.Errorf("config %s: %w", opts.ConfigPath, err)
	}
	dv, err := derive.New(cfg.Request)
	if err != nil {
		d.closeStore()
		return nil, fmt.Errorf("config %s: %w", opts.ConfigPath, err)
	}
	d.live.Store(&inForce{cfg: cfg, policy: p, deriver: dv, file: d.newLoaded(data)})
	d.openChanges(cfg)
	if err := d.initOps(cfg); err != nil {
		d.closeStore()
		return nil, err
	}
	return d, nil
}

// redisStartTimeout bounds how long New waits for Redis to answer before
// starting without it.
const redisStartTimeout = time.Second

// openStore creates the store that [store] describes: the embedded store,
// or the Redis store when store.redis lists addresses.
//
// A Redis that cannot be reached does not stop the daemon from starting:
// it starts, logs a warning, answers checks as each rule's fail mode says
// while Redis is down (see policy.Fallback), and uses Redis as soon as it
// answers. A daemon that refused to start would leave its host's clients
// with no answers at all, for an outage that may be over in seconds. A configuration that
// Redis rejects (a wrong password) does stop it: waiting will not help.
func (d *Daemon) openStore(sc *config.Store) error {
	key, err := sc.LeaseKey()
	if err != nil {
		return err
	}
	defer func() { d.stores.LeaseKey = key }()
	if !sc.UsesRedis() {
		d.mem = memstore.New(memstore.Options{MaxKeys: sc.MaxKeys})
		d.stores = policy.Stores{Cached: d.mem}
		return nil
	}
	password, tc, err := sc.Credentials()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), redisStartTimeout)
	defer cancel()
	c, err := redisx.New(ctx, redisOptions(sc, password, tc))
	if err != nil {
		return fmt.Errorf("cannot use store.redis: %w", err)
	}
	// Ping until the start-up timeout, not just once: a first
	// connection can take longer than one call may.
	if err := pingUntil(ctx, c); err != nil {
		d.redisSilent = true
		d.log.Warn("redis does not answer; starting anyway: checks that need it follow their rules' fail modes until it does",
			slog.Any("redis", sc.Redis), slog.String("mode", string(sc.Mode)), slog.Any("error", err))
	} else {
		if err := checkServerMode(ctx, c, sc); err != nil {
			c.Close()
			return fmt.Errorf("cannot use store.redis: %w", err)
		}
		d.log.Info("using redis", slog.Any("redis", sc.Redis), slog.String("mode", string(sc.Mode)))
	}
	d.redis = c
	d.tops = redisx.NewTops(c)
	d.fleet = newFleet(c, sc)
	d.fleet.password, d.fleet.tls = password, tc
	d.stores = d.fleet.stores()
	return nil
}

// checkServerMode refuses a Redis whose kind does not match store.mode: a
// Cluster node named as a standalone server (the keys of other nodes'
// slots would never be decided there), a sentinel's own port named as a
// standalone server, or a plain server named as a Cluster. Waiting would
// not fix any of these. When INFO cannot be read (an ACL may deny it),
// nothing is refused.
func checkServerMode(ctx context.Context, c *redisx.Client, sc *config.Store) error {
	got, err := c.ServerMode(ctx)
	if err != nil {
		return nil
	}
	return modeMismatch(sc, got)
}

// modeMismatch says how a Redis whose INFO reports redis_mode got does
// not fit store.mode, or returns nil when it fits.
func modeMismatch(sc *config.Store, got string) error {
	want := "standalone" // a sentinel hands out a plain primary
	if sc.Mode == config.RedisCluster {
		want = "cluster"
	}
	if got == want {
		return nil
	}
	hint := map[string]string{
		"cluster":    `it is a Redis Cluster node: set store.mode = "cluster"`,
		"sentinel":   `it is a sentinel: set store.mode = "sentinel" and store.master_set`,
		"standalone": `it is not a Cluster node: set store.mode = "standalone" (or "sentinel" with its sentinels)`,
	}[got]
	if hint == "" {
		hint = "redis_mode " + got
	}
	return fmt.Errorf("store.mode = %q, but the Redis at %s reports redis_mode %s: %s", sc.Mode, strings.Join(sc.Redis, ", "), got, hint)
}

// checkServerModeLater, for a daemon that started while Redis was silent,
// checks the kind of Redis once it answers INFO (modeMismatch), every
// second until then: a mismatch can no longer stop the daemon, so it is
// logged as an error.
func (d *Daemon) checkServerModeLater(ctx context.Context) {
	sc := &d.cfg().Store
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		got, err := d.redis.ServerMode(ctx)
		if err != nil {
			if redisx.IsReply(err) {
				return // INFO refused (an ACL): nothing to check, as at a start
			}
			continue // not answering yet
		}
		if err := modeMismatch(sc, got); err != nil {
			d.log.Error("cannot use store.redis: checks follow their fail modes or go wrong; fix the configuration and restart", slog.Any("error", err))
		}
		return
	}
}

// pingUntil pings c until it answers or ctx is done, and returns the last
// error.
func pingUntil(ctx context.Context, c *redisx.Client) error {
	for {
		err := c.Ping(ctx)
		if err == nil || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// closeStore closes the Redis client, if there is one.
func (d *Daemon) closeStore() {
	if d.redis != nil {
		d.redis.Close()
	}
}

func applyOverrides(cfg *config.Config, opts Options) {
	if opts.Socket != "" {
		cfg.Server.Socket = opts.Socket
	}
	if opts.HTTP != nil {
		cfg.Server.HTTP = *opts.HTTP
	}
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("cannot parse log_level=%q: %w", level, err)
	}
	o := &slog.HandlerOptions{Level: lv}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, o)), nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, o)), nil
}

// inForce is the configuration in force and what is built from it. A
// reload swaps all of it at once, so that no reader sees the rules of one
// file with the request derivation or the file hash of another; a change
// of the overrides and blocks, or a re-read of the request keys, swaps in
// a copy with a new policy or deriver (swapLocked).
type inForce struct {
	cfg     *config.Config
	policy  *policy.Policy  // compiled from cfg with the changes in force
	deriver *derive.Deriver // turns requests' attributes into descriptors ([request])
	file    *loadedConfig   // the file cfg was read from
}

// cfg returns the configuration in force.
func (d *Daemon) cfg() *config.Config { return d.live.Load().cfg }

// pol returns the policy in force.
func (d *Daemon) pol() *policy.Policy { return d.live.Load().policy }

// dv returns the deriver in force.
func (d *Daemon) dv() *derive.Deriver { return d.live.Load().deriver }

// swapLocked puts in force a copy of what is in force that set changes.
// The caller holds reloadMu, or is New.
func (d *Daemon) swapLocked(set func(*inForce)) {
	next := *d.live.Load()
	set(&next)
	d.live.Store(&next)
}

// Ready is closed once the daemon listens and serves.
func (d *Daemon) Ready() <-chan struct{} { return d.ready }

// SocketPath returns the Unix socket path the daemon serves: once it is
// ready, the listener's own (under socket activation, the socket systemd
// passed, wherever the configuration says), before that server.socket.
func (d *Daemon) SocketPath() string {
	select {
	case <-d.ready:
		return d.ln.Addr().String()
	default:
		return d.cfg().Server.Socket
	}
}

// HTTPAddr returns the HTTP listener's address, or "" when HTTP is off or
// not listening yet.
func (d *Daemon) HTTPAddr() string {
	select {
	case <-d.ready:
	default:
		return ""
	}
	if d.httpLn == nil {
		return ""
	}
	return d.httpLn.Addr().String()
}

// Reload reads the configuration file again and swaps in its rules. An
// unchanged file is skipped; an invalid one is rejected with an error and
// the rules in force stay. Server settings take effect only on restart.
func (d *Daemon) Reload() error {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	data, err := os.ReadFile(d.opts.ConfigPath)
	if err == nil && bytes.Equal(data, d.lastConfig) {
		// The files the configuration names (request.jwt.keys_file) may
		// have changed: they are read again.
		if dv, err := derive.New(d.cfg().Request); err != nil {
			d.log.Error("request.jwt keys reload failed; keeping the keys in force", slog.Any("error", err))
		} else {
			d.swapLocked(func(f *inForce) { f.deriver = dv })
		}
		d.log.Info("config unchanged; reload skipped (request keys read again)", slog.String("path", d.opts.ConfigPath))
		d.inForceAgainLocked()
		return nil
	}
	var cfg *config.Config
	var p *policy.Policy
	var dv *derive.Deriver
	if err == nil {
		cfg, err = config.Parse(data, d.opts.ConfigPath)
	}
	if err == nil {
		applyOverrides(cfg, d.opts)
		p, err = policy.Compile(cfg, d.pol().Changes(), d.stores)
	}
	if err == nil {
		dv, err = derive.New(cfg.Request)
	}
	if err != nil {
		reloadsFailed.Inc()
		lastReloadOK.Set(0)
		d.failedConfig = "read error"
		if data != nil {
			d.failedConfig = ConfigHash(data)
		}
		d.log.Error("config reload failed; keeping the rules in force", slog.String("path", d.opts.ConfigPath), slog.Any("error", err))
		return fmt.Errorf("cannot reload config: %w", err)
	}
	old := d.cfg()
	if !reflect.DeepEqual(old.Server, cfg.Server) {
		d.log.Warn("[server] settings changed; they take effect on restart")
		cfg.Server = old.Server
	}
	if !reflect.DeepEqual(old.Store, cfg.Store) {
		d.log.Warn("[store] settings changed; they take effect on restart")
		cfg.Store = old.Store
	}
	keepOpsSettings(d.log, old, cfg)
	lc := d.newLoaded(data)
	d.live.Store(&inForce{cfg: cfg, policy: p, deriver: dv, file: lc})
	d.reportChanges(p)
	d.lastConfig = data
	d.failedConfig = ""
	d.announceLoaded(lc)
	reloadsOK.Inc()
	lastReloadOK.Set(1)
	d.log.Info("config reloaded", slog.String("path", d.opts.ConfigPath), slog.Int("rules", len(cfg.Rules)))
	return nil
}

// Run listens, signals readiness, and serves until ctx is done; then it
// stops accepting, answers what it has read, removes the socket and
// returns. It returns an error only when it could not start.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.closeStore()
	hup := d.opts.Reload
	srv := d.cfg().Server
	ln, err := activatedListener()
	if err != nil {
		return err
	}
	activated := ln != nil
	if ln == nil {
		if ln, err = listenUnix(srv.Socket, srv.SocketFileMode()); err != nil {
			return err
		}
	} else {
		if addr := ln.Addr().String(); addr != srv.Socket {
			d.log.Info("socket activation: serving the socket systemd passed, not server.socket",
				slog.String("socket", addr), slog.String("configured", srv.Socket))
		} else {
			d.log.Info("socket activation: serving the socket systemd passed", slog.String("socket", addr))
		}
	}
	d.ln = ln
	if err := d.startEnvoy(); err != nil {
		ln.Close()
		return err
	}
	defer d.stopEnvoy() // on the error returns below; shutdown drains it first
	if srv.HTTP != "" {
		hl, err := net.Listen("tcp", srv.HTTP)
		if err != nil {
			ln.Close()
			return fmt.Errorf("cannot listen on http=%q: %w", srv.HTTP, err)
		}
		d.httpLn = hl
		d.httpSrv = d.newHTTPServer()
		go func() {
			if err := d.httpSrv.Serve(hl); err != nil {
				d.log.Error("http server stopped", slog.Any("error", err))
			}
		}()
	}
	if err := d.startAdminHTTP(); err != nil {
		ln.Close()
		if d.httpSrv != nil {
			_ = d.httpSrv.Shutdown()
		}
		return err
	}
	if err := d.listenHTTPSocket(srv); err != nil {
		ln.Close()
		if d.httpLn != nil {
			d.httpLn.Close()
		}
		if d.ops.httpLn != nil {
			d.ops.httpLn.Close()
		}
		return err
	}
	sweepCtx, stopSweep := context.WithCancel(context.Background())
	defer stopSweep()
	if poll := time.Duration(d.cfg().Server.ConfigPoll); poll > 0 {
		go d.pollConfig(sweepCtx, poll)
	}
	if d.mem != nil {
		go d.mem.Run(sweepCtx, time.Duration(d.cfg().Store.SweepInterval))
	}
	if d.region != nil {
		d.region.Start()
	}
	if d.fleet != nil {
		d.fleet.start(d.log)
		go d.watchChanges(sweepCtx, time.Duration(d.cfg().Store.ChangesPoll))
		go d.ops.obs.Publish(sweepCtx, d.tops, syncTimeout, d.log)
		if d.redisSilent {
			go d.checkServerModeLater(sweepCtx)
		}
	}

	// Checks run on connCtx, which outlives ctx until the drain is done:
	// a request read before the shutdown is answered, not cancelled.
	connCtx, cancelConns := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelConns()
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		d.accept(connCtx)
	}()
	close(d.ready)
	if err := sdNotify("READY=1"); err != nil {
		d.log.Warn("sd_notify failed", slog.Any("error", err))
	}
	bi := buildinfo.Get()
	d.log.Info("rld serving", slog.String("socket", ln.Addr().String()), slog.Bool("activated", activated),
		slog.String("http", d.HTTPAddr()), slog.Int("rules", len(d.cfg().Rules)),
		slog.String("version", bi.Version), slog.String("commit", bi.Commit))

	// The watchdog is kept from this loop, which also runs the reloads: a
	// reload that hangs, or a daemon that no longer schedules it, stops
	// the pings and systemd restarts the daemon.
	var watchdog <-chan time.Time
	if every := watchdogInterval(); every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		watchdog = t.C
		d.log.Info("systemd watchdog enabled", slog.Duration("ping_every", every))
	}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-hup:
			_ = d.Reload()
		case <-watchdog:
			if err := sdNotify("WATCHDOG=1"); err != nil {
				d.log.Warn("sd_notify WATCHDOG=1 failed", slog.Any("error", err))
			}
		}
	}
	_ = sdNotify("STOPPING=1")
	d.shutdown(acceptDone)
	return nil
}

// RefusedLogInterval is how often at most the daemon logs the
// connections it refused over max_connections: the first at once, then
// one line per interval with the count since the last line, so that a
// local user opening connections in a loop cannot make it log at that
// rate. rld_connections_rejected_total counts every one.
const RefusedLogInterval = 10 * time.Second

// accept serves connections until the listener closes.
func (d *Daemon) accept(ctx context.Context) {
	maxConns := int64(d.cfg().Server.MaxConnections)
	var refused int64      // refused since the last log line
	var loggedAt time.Time // when that line was written
	for {
		c, err := d.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			d.log.Warn("accept failed", slog.Any("error", err))
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		connsAccepted.Inc()
		if d.nconns.Add(1) > maxConns {
			d.nconns.Add(-1)
			connsRejected.Inc()
			// Closed at once, with nothing written: the client sent no
			// request, so it gets no answer (a frame with id 0 would
			// answer a request that was never made).
			c.Close()
			refused++
			if now := time.Now(); now.Sub(loggedAt) >= RefusedLogInterval {
				d.log.Warn("too many connections; refused and closed", slog.Int64("refused", refused),
					slog.Int64("max_connections", maxConns), slog.Duration("log_interval", RefusedLogInterval))
				refused, loggedAt = 0, now
			}
			continue
		}
		d.connsMu.Lock()
		d.conns[c] = struct{}{}
		d.connsMu.Unlock()
		d.connWG.Add(1)
		connsOpen.Inc()
		go func() {
			defer func() {
				d.connsMu.Lock()
				delete(d.conns, c)
				d.connsMu.Unlock()
				d.nconns.Add(-1)
				connsOpen.Dec()
				d.connWG.Done()
			}()
			d.newConn(c).serve(ctx)
		}()
	}
}

// shutdown stops accepting, lets every connection answer what it has read,
// and waits up to drain_timeout before closing what is left.
func (d *Daemon) shutdown(acceptDone <-chan struct{}) {
	d.log.Info("draining")
	d.draining.Store(true)
	d.ln.Close() // also removes the socket file
	<-acceptDone
	d.connsMu.Lock()
	for c := range d.conns {
		_ = c.SetReadDeadline(time.Now())
	}
	d.connsMu.Unlock()
	done := make(chan struct{})
	go func() { d.connWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Duration(d.cfg().Server.DrainTimeout)):
		d.log.Warn("drain timeout; closing remaining connections")
		d.connsMu.Lock()
		for c := range d.conns {
			c.Close()
		}
		d.connsMu.Unlock()
		<-done
	}
	d.stopEnvoy()
	if d.httpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.cfg().Server.DrainTimeout))
		_ = d.httpSrv.ShutdownWithContext(ctx)
		cancel()
	}
	d.stopAdminHTTP()
	// No check runs any more: store the automatic blocks queued.
	d.stopAutoBlocks()
	if d.region != nil {
		d.region.Close()
	}
	if d.fleet != nil {
		// Every answer is out: give the leases back for the others.
		d.fleet.close(d.log)
	}
	d.ops.obs.Close()
	d.log.Info("stopped")
}
