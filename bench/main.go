package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Target names (-targets).
const (
	targetEcho  = "echo"
	targetRedis = "redis"
	targetRLD   = "rld"
)

// Stores of the spawned daemon (-store).
const (
	storeEmbedded = "embedded"
	storeRedis    = "redis"
)

// Modes of the spawned daemon's rule (-rule-mode).
const (
	ruleCached = "cached"
	ruleStrict = "strict"
)

// table is one table of a run: the targets measured against the daemon
// on one store, with one rule mode.
type table struct {
	store string // "" when the daemon is not spawned
	mode  string
}

// tables returns the tables of a run: one per store, and on Redis one
// per rule mode.
func (c *options) tables() []table {
	var out []table
	for _, store := range c.stores {
		if store != storeRedis {
			out = append(out, table{store: store, mode: c.ruleModes[0]})
			continue
		}
		for _, mode := range c.ruleModes {
			out = append(out, table{store: store, mode: mode})
		}
	}
	return out
}

// Defaults of the flags.
const (
	defaultRate        = 10_000
	defaultConnections = 4
	defaultDepth       = 8
	defaultDuration    = 10 * time.Second
	defaultWarmup      = 2 * time.Second
	defaultKeys        = 10_000
	defaultZipf        = 1.1
	defaultDescriptors = "api_key=k{n} endpoint=/v1/search"
	defaultLimit       = 1_000_000_000
	defaultRedis       = "127.0.0.1:6379"
	defaultSocket      = "/run/rld/rld.sock"
)

// defaultPeriod is the default period of -limit: the limit is per second.
const defaultPeriod = time.Second

// Bounds of the flags.
const (
	maxConnections = 4096
	maxDepth       = 65536
)

// options is the checked command line.
type options struct {
	load      load
	targets   []string
	stores    []string // with -spawn; else one ""
	tmpl      *template
	cost      uint32
	limit     int64 // per period: the spawned rule's, and the redis target's
	period    time.Duration
	algorithm string   // the spawned rule's algorithm
	ruleModes []string // with -spawn: the rule's modes, cached or strict; a table each on Redis
	spawn     bool
	rldBin    string // with -spawn
	socket    string // without -spawn
	pid       int    // without -spawn: the daemon's process, 0 if not given
	redis     string // without -spawn
	// cluster holds seed nodes of a Redis Cluster: the spawned daemon's
	// store and the redis target's Redis, instead of a spawned
	// redis-server.
	cluster []string
	// statNodes are the Redis nodes whose script calls and CPU time are
	// read, when given.
	statNodes []string
	json      bool
	plot      string
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the program: it returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "echo" {
		fs := flag.NewFlagSet("rld-bench echo", flag.ContinueOnError)
		fs.SetOutput(stderr)
		sock := fs.String("socket", "", "Unix socket `path` to serve")
		if err := fs.Parse(args[1:]); err != nil || *sock == "" {
			fmt.Fprintln(stderr, "usage: rld-bench echo -socket PATH")
			return 2
		}
		if err := echoMain(*sock); err != nil {
			fmt.Fprintln(stderr, "rld-bench:", err)
			return 1
		}
		return 0
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "rld-bench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }() // a second ^C kills at once
	if err := bench(ctx, cfg, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "rld-bench:", err)
		return 1
	}
	return 0
}

// parseFlags parses and checks the command line.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("rld-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: rld-bench [flags]          measure check latency of echo, redis and rld
       rld-bench echo -socket PATH  serve the echo target (what -spawn starts)

flags:
`)
		fs.PrintDefaults()
	}
	mode := fs.String("mode", modeOpen, "`open`: send at -rate on a schedule; closed: keep -depth in flight, as fast as possible")
	rate := fs.Float64("rate", defaultRate, "open loop: requests per `second`, over all connections")
	conns := fs.Int("connections", defaultConnections, "connections to each target")
	depth := fs.Int("depth", defaultDepth, "requests in flight per connection, at most (pipelining)")
	duration := fs.Duration("duration", defaultDuration, "length of the measurement, per target")
	warmup := fs.Duration("warmup", defaultWarmup, "load before the measurement, not measured")
	dist := fs.String("dist", distZipf, "key distribution: `hot` (one key), uniform or zipf over -keys")
	keys := fs.Int("keys", defaultKeys, "number of keys")
	zipf := fs.Float64("zipf", defaultZipf, "exponent `s` of -dist zipf: key k has probability ∝ 1/(k+1)^s")
	descs := fs.String("descriptors", defaultDescriptors, "descriptors of each check, space-separated; {n} is the key number")
	cost := fs.Uint64("cost", 1, "cost of each check")
	targets := fs.String("targets", targetEcho+","+targetRLD, "targets, comma-separated, measured in this order: echo, redis, rld")
	spawn := fs.Bool("spawn", false, "start rld (and redis-server when needed) in a temporary directory; else use -socket and -redis")
	stores := fs.String("store", storeEmbedded, "with -spawn: the daemon's store, embedded or redis; a comma-separated list makes one table per store")
	ruleMode := fs.String("rule-mode", "cached", "with -spawn: the rule's `mode`, cached (leases on Redis) or strict (every check in Redis); cached,strict makes one Redis table per mode")
	limit := fs.Int64("limit", defaultLimit, "with -spawn and for the redis target: the rule's limit per -period (lower it to see limited answers); each key's allowed answers are checked against it")
	period := fs.Duration("period", defaultPeriod, "with -spawn and for the redis target: the rule's period")
	alg := fs.String("algorithm", algTokenBucket, "with -spawn: the rule's `algorithm`: "+strings.Join(algorithms, ", ")+" (the redis target runs token_bucket)")
	rldBin := fs.String("rld", "", "with -spawn: the rld `binary` (default bin/rld, else rld on PATH)")
	socket := fs.String("socket", "", "without -spawn: rld's socket `path` (default $RLD_SOCKET, else "+defaultSocket+")")
	redis := fs.String("redis", defaultRedis, "without -spawn: the Redis `host:port` of the redis target")
	cluster := fs.String("redis-cluster", "", "`host:port,...`: primaries of a Redis Cluster that the spawned daemon (-store redis) and the redis target use instead of a spawned redis-server; their script calls and CPU are read")
	statNodes := fs.String("redis-nodes", "", "`host:port,...`: the Redis nodes whose script calls and CPU time are read for each Redis-backed target (default: the spawned redis-server, or -redis-cluster)")
	pid := fs.Int("pid", 0, "without -spawn: the daemon's process `id`, whose CPU time per decision is read from /proc")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	plot := fs.String("plot", "", "write the latency-by-percentile curves of every target to this SVG `file`")
	seed := fs.Uint64("seed", 1, "seed of the key draws")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}

	c := &options{spawn: *spawn, limit: *limit, period: *period, algorithm: *alg, json: *asJSON, plot: *plot, redis: *redis, pid: *pid}
	var problems []error
	bad := func(format string, a ...any) { problems = append(problems, fmt.Errorf(format, a...)) }
	switch *mode {
	case modeOpen:
		if !(*rate > 0) || *rate > 1e8 {
			bad("-rate=%v: want above 0 and at most 1e8", *rate)
		}
	case modeClosed:
		*rate = 0
	default:
		bad("-mode=%q: want open or closed", *mode)
	}
	if *conns < 1 || *conns > maxConnections {
		bad("-connections=%d: want 1 to %d", *conns, maxConnections)
	}
	if *depth < 1 || *depth > maxDepth {
		bad("-depth=%d: want 1 to %d", *depth, maxDepth)
	}
	if *duration <= 0 {
		bad("-duration=%v: must be positive", *duration)
	}
	if *warmup < 0 {
		bad("-warmup=%v: must not be negative", *warmup)
	}
	if *cost < 1 || *cost > 1<<32-1 {
		bad("-cost=%d: want 1 to 4294967295", *cost)
	}
	c.cost = uint32(*cost)
	if *limit < 1 {
		bad("-limit=%d: must be positive", *limit)
	}
	if *period < time.Millisecond || *period%time.Millisecond != 0 {
		bad("-period=%v: want a whole number of milliseconds, at least 1ms", *period)
	}
	var err error
	if c.ruleModes, err = parseList(*ruleMode, ruleCached, ruleStrict); err != nil {
		bad("-rule-mode=%q: %w", *ruleMode, err)
	}
	ks, err := newKeySpace(*dist, *keys, *zipf)
	if err != nil {
		problems = append(problems, err)
	}
	c.tmpl, err = parseTemplate(*descs, *keys-1)
	if err != nil {
		bad("-descriptors=%q: %w", *descs, err)
	} else if len(c.tmpl.descs) == 0 {
		bad("-descriptors=%q: name at least one descriptor", *descs)
	}
	c.targets, err = parseList(*targets, targetEcho, targetRedis, targetRLD)
	if err != nil {
		bad("-targets=%q: %w", *targets, err)
	}
	switch {
	case !slices.Contains(algorithms, *alg):
		bad("-algorithm=%q: want %s", *alg, strings.Join(algorithms, ", "))
	case *alg != algTokenBucket && slices.Contains(c.targets, targetRedis):
		bad("-algorithm=%q: the redis target runs token_bucket only", *alg)
	}
	if c.spawn {
		c.stores, err = parseList(*stores, storeEmbedded, storeRedis)
		if err != nil {
			bad("-store=%q: %w", *stores, err)
		}
		if c.rldBin, err = findRLD(*rldBin); err != nil && slices.Contains(c.targets, targetRLD) {
			problems = append(problems, err)
		}
	} else {
		c.stores = []string{""}
		c.socket = *socket
		if c.socket == "" {
			c.socket = os.Getenv("RLD_SOCKET")
		}
		if c.socket == "" {
			c.socket = defaultSocket
		}
	}
	if c.cluster, err = parseAddrs(*cluster); err != nil {
		bad("-redis-cluster=%q: %w", *cluster, err)
	}
	if c.statNodes, err = parseAddrs(*statNodes); err != nil {
		bad("-redis-nodes=%q: %w", *statNodes, err)
	}
	if *pid < 0 || *pid > 0 && c.spawn {
		bad("-pid=%d: give a positive pid, and only without -spawn", *pid)
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	c.load = load{mode: *mode, rate: *rate, conns: *conns, depth: *depth, warmup: *warmup,
		duration: *duration, keys: ks, seed: *seed}
	return c, nil
}

// parseAddrs parses a comma-separated list of distinct host:port
// addresses; "" is none.
func parseAddrs(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return nil, err
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || host == "" {
			return nil, fmt.Errorf("%q: want host:port", a)
		}
		if slices.Contains(out, a) {
			return nil, fmt.Errorf("%q listed twice", a)
		}
		out = append(out, a)
	}
	return out, nil
}

// parseList parses a comma-separated list of distinct names from allowed.
func parseList(s string, allowed ...string) ([]string, error) {
	var out []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		switch {
		case !slices.Contains(allowed, name):
			return nil, fmt.Errorf("unknown %q: want %s", name, strings.Join(allowed, ", "))
		case slices.Contains(out, name):
			return nil, fmt.Errorf("%q listed twice", name)
		}
		out = append(out, name)
	}
	return out, nil
}
