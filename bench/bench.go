package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// bench measures every target under c's load, one table per store of
// the spawned daemon, prints the tables (or the JSON report), and writes
// the plot. The processes it started are stopped when it returns.
func bench(ctx context.Context, c *options, stdout, stderr io.Writer) error {
	ps, err := newProcs()
	if err != nil {
		return err
	}
	defer ps.close()
	e := &env{c: c, ps: ps, rld: map[table]string{}, rldPID: map[table]int{}}
	rep := &Report{
		Mode: c.load.mode, Rate: c.load.rate, Connections: c.load.conns, Depth: c.load.depth,
		DurationS: c.load.duration.Seconds(), WarmupS: c.load.warmup.Seconds(),
		Keys: c.load.keys.String(), Descriptors: c.tmpl.String(), Cost: c.cost,
	}
	if !c.json {
		fmt.Fprint(stdout, "rld-bench: ", rep.describe())
	}
	tables := c.tables()
	for _, tb := range tables {
		store := tb.store
		tbl := Table{Store: store}
		if store == storeRedis && len(c.ruleModes) > 1 {
			tbl.Mode = tb.mode
		}
		for _, name := range c.targets {
			t, label, pr, err := e.target(ctx, name, tb)
			if err != nil {
				return err
			}
			fmt.Fprintf(stderr, "rld-bench: measuring %s for %v after a %v warm-up\n", label, c.load.duration, c.load.warmup)
			var bc *boundCheck
			if rule, ok := c.boundRule(name); ok {
				bc = newBoundCheck(rule, c.load.keys.n, c.tmpl.keyed())
			}
			m, err := runLoad(ctx, t, &c.load, pr, bc)
			if err != nil {
				return fmt.Errorf("%s: %w", label, err)
			}
			r, err := newResult(label, m, &c.load)
			if err != nil {
				return err
			}
			tbl.Results = append(tbl.Results, r)
		}
		tbl.setRatios()
		rep.Tables = append(rep.Tables, tbl)
		if !c.json {
			if store != "" {
				fmt.Fprintf(stdout, "\nrld on the %s store", store)
				if tbl.Mode != "" {
					fmt.Fprintf(stdout, ", %s rule", tbl.Mode)
				}
				fmt.Fprintln(stdout, ":")
			} else {
				fmt.Fprintln(stdout)
			}
			if err := writeTable(stdout, &tbl); err != nil {
				return err
			}
			warnSlow(stdout, &tbl, &c.load)
		}
	}
	if c.json {
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
	}
	if c.plot != "" {
		if err := savePlot(c.plot, rep); err != nil {
			return err
		}
		if !c.json {
			fmt.Fprintln(stdout, "\nplot:", c.plot)
		}
	}
	return nil
}

// boundRule returns the rule that the answers of target name obey, when
// rld-bench knows it: the spawned daemon's, and the redis target's token
// bucket.
func (c *options) boundRule(name string) (boundRule, bool) {
	switch {
	case name == targetRedis:
		return boundRule{alg: algTokenBucket, limit: c.limit, period: c.period}, true
	case name == targetRLD && c.spawn:
		return boundRule{alg: c.algorithm, limit: c.limit, period: c.period}, true
	}
	return boundRule{}, false
}

// warnSlow notes the targets of an open-loop table that did not keep up
// with the rate: their latencies include their backlog.
func warnSlow(w io.Writer, t *Table, l *load) {
	if l.mode != modeOpen {
		return
	}
	for _, r := range t.Results {
		if r.Unsent > 0 || r.AchievedRate < slowFraction*l.rate {
			fmt.Fprintf(w, "%s did not keep up: it answered %s/s of the %s/s asked; lower -rate to measure it unloaded\n",
				r.Target, group(int64(r.AchievedRate)), group(int64(l.rate)))
		}
	}
}

// slowFraction is the share of the rate below which a target is said
// not to keep up.
const slowFraction = 0.95

// savePlot writes the curves of every result of rep to the SVG file path.
// The curves of the second and later tables are dashed, and their labels
// name the table when the first table has the same one.
func savePlot(path string, rep *Report) error {
	var curves []curve
	seen := map[string]bool{}
	for i, t := range rep.Tables {
		for _, r := range t.Results {
			label := r.Target
			if seen[label] {
				label += " (" + strings.TrimSpace(t.Store+" "+t.Mode) + " table)"
			}
			seen[label] = true
			curves = append(curves, curve{label: label, hist: r.hist, dashed: i > 0})
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("cannot write the plot: %w", err)
	}
	desc := strings.SplitN(rep.describe(), "\n", 2)[0]
	err = writePlot(f, "rld-bench: latency by percentile", desc, curves)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cannot write the plot %s: %w", path, err)
	}
	return nil
}

// env makes the targets, starting what they need once: the echo server
// always, redis-server and the daemons with -spawn.
type env struct {
	c       *options
	ps      *procs
	echo    string           // the echo server's socket, once started
	echoPID int              // its process
	redis   string           // the spawned Redis's address, once started
	rld     map[table]string // spawned daemons' sockets by table
	rldPID  map[table]int    // their processes
}

// target returns the target called name for the table tb, its label,
// and the probe that reads its costs (nil when there is nothing to
// read).
func (e *env) target(ctx context.Context, name string, tb table) (target, string, *probe, error) {
	c, store := e.c, tb.store
	switch name {
	case targetEcho:
		if e.echo == "" {
			sock, pid, err := e.ps.startEcho(ctx)
			if err != nil {
				return nil, "", nil, err
			}
			e.echo, e.echoPID = sock, pid
		}
		return &socketTarget{path: e.echo, tmpl: c.tmpl, cost: c.cost}, name, &probe{pid: e.echoPID}, nil
	case targetRedis:
		addrs := []string{c.redis}
		switch {
		case len(c.cluster) > 0:
			addrs = c.cluster
		case c.spawn:
			addr, err := e.spawnedRedis(ctx)
			if err != nil {
				return nil, "", nil, err
			}
			addrs = []string{addr}
		}
		nodes, err := e.nodes(ctx, store)
		if err != nil {
			return nil, "", nil, err
		}
		return newRedisTarget(addrs, c.tmpl, c.load.depth, c.limit, c.period, c.cost), name, &probe{nodes: nodes}, nil
	}
	label, sock, pid := targetRLD, c.socket, c.pid
	if c.spawn {
		if store == storeRedis {
			label = "rld-on-redis"
			if len(c.ruleModes) > 1 && tb.mode != ruleCached {
				label += "-" + tb.mode
			}
		}
		var err error
		if sock, err = e.spawnedRLD(ctx, tb); err != nil {
			return nil, "", nil, err
		}
		pid = e.rldPID[tb]
	} else if err := ping(sock); err != nil {
		return nil, "", nil, fmt.Errorf("no rld answers PING on %s (start one, pass -socket, or use -spawn): %w", sock, err)
	}
	pr := &probe{pid: pid}
	if store != storeEmbedded {
		var err error
		if pr.nodes, err = e.nodes(ctx, store); err != nil {
			return nil, "", nil, err
		}
	}
	return &socketTarget{path: sock, tmpl: c.tmpl, cost: c.cost}, label, pr, nil
}

// nodes returns the Redis nodes whose script calls and CPU time are read
// for a target of the table of store: -redis-nodes when given, else the
// Redis of the spawned daemon (-redis-cluster, or the spawned
// redis-server) or none.
func (e *env) nodes(ctx context.Context, store string) ([]string, error) {
	c := e.c
	switch {
	case len(c.statNodes) > 0:
		return c.statNodes, nil
	case len(c.cluster) > 0:
		return c.cluster, nil
	case c.spawn && (store == storeRedis || slices.Contains(c.targets, targetRedis)):
		addr, err := e.spawnedRedis(ctx)
		if err != nil {
			return nil, err
		}
		return []string{addr}, nil
	}
	return nil, nil
}

func (e *env) spawnedRedis(ctx context.Context) (string, error) {
	if e.redis == "" {
		addr, err := e.ps.startRedis(ctx)
		if err != nil {
			return "", err
		}
		e.redis = addr
	}
	return e.redis, nil
}

func (e *env) spawnedRLD(ctx context.Context, tb table) (string, error) {
	if sock, ok := e.rld[tb]; ok {
		return sock, nil
	}
	store, name := tb.store, "rld-"+tb.store+"-"+tb.mode
	rc := &rldConfig{
		socket:   filepath.Join(e.ps.dir, name+".sock"),
		names:    e.c.tmpl.names(),
		limit:    e.c.limit,
		period:   e.c.period,
		alg:      e.c.algorithm,
		mode:     tb.mode,
		prefix:   "rld-bench-" + tb.store + "-" + tb.mode + ":",
		keys:     e.c.load.keys.n,
		inflight: e.c.load.depth,
	}
	if store == storeRedis {
		if len(e.c.cluster) > 0 {
			rc.redis, rc.cluster = e.c.cluster, true
		} else {
			addr, err := e.spawnedRedis(ctx)
			if err != nil {
				return "", err
			}
			rc.redis = []string{addr}
		}
	}
	pid, err := e.ps.startRLD(ctx, name, e.c.rldBin, rc)
	if err != nil {
		return "", err
	}
	e.rld[tb], e.rldPID[tb] = rc.socket, pid
	return rc.socket, nil
}
