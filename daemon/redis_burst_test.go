package daemon_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// Bursts: every rule allows burstLimit units per burstPeriod (capacity
// burstLimit), short so that thousands of checks take seconds.
const (
	burstLimit  = 100
	burstPeriod = 200 * time.Millisecond
)

// burstKinds are the algorithms that cached rules lease.
var burstKinds = []algo.Kind{algo.TokenBucket, algo.GCRA, algo.FixedWindow, algo.SlidingCounter}

// burstConfig is rld.toml for the burst tests: for each algorithm that
// leases, a cached rule (alg = its name) and a strict one (alg =
// "strict-" and its name), counting by api_key; store.timeout is
// timeout, or the default when it is "".
func burstConfig(store, timeout string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nmax_connections = 1000\n\n[store]\n%s\nsync_interval = \"100ms\"\n", store)
	if timeout != "" {
		fmt.Fprintf(&b, "timeout = %q\n", timeout)
	}
	for _, k := range burstKinds {
		for _, mode := range []string{"cached", "strict"} {
			name := k.String()
			if mode == "strict" {
				name = "strict-" + name
			}
			fmt.Fprintf(&b, "\n[[rule]]\nname = %q\nmatch = { alg = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = %d\nperiod = %q\nmode = %q\n",
				name, name, k, burstLimit, burstPeriod, mode)
		}
	}
	return b.String()
}

// burstShape is a client's traffic: n bursts of size checks at once,
// one every every at best, each starting at offset into an
// epoch-aligned period (the windows' own alignment).
type burstShape struct {
	size   int
	every  time.Duration
	offset time.Duration
	n      int
}

// shapes returns the traffic under test for kind: bursts of 80% of the
// capacity, and bursts of exactly the capacity. A burst starts no
// sooner than the exact algorithm admits it whole, whatever the time
// the previous one took on a loaded machine (see nextBurst), so that
// the strict rule refuses none of it: for a bucket (token bucket, GCRA)
// every period for 80% (80% of the rate), every 1.25 periods for the
// capacity; for a fixed window once per window. A sliding counter's
// estimate weighs the previous window, so that it refuses an 80% burst
// early in a window after another in the window before: its bursts come
// every other window (40% and 50% of the rate).
func shapes(kind algo.Kind) map[string]burstShape {
	eighty := burstShape{size: burstLimit * 8 / 10, every: burstPeriod, offset: burstPeriod / 10, n: 25}
	full := burstShape{size: burstLimit, every: 5 * burstPeriod / 4, offset: burstPeriod / 10, n: 20}
	switch kind {
	case algo.FixedWindow:
		full.every = burstPeriod
	case algo.SlidingCounter:
		eighty.every, full.every = 2*burstPeriod, 2*burstPeriod
	}
	return map[string]burstShape{"80%": eighty, "capacity": full}
}

// nextBurst returns when the burst after one sent from start to end (its
// last answer) may start: shape.every after start, and no sooner than
// the exact algorithm has room for a whole burst again: for a bucket,
// once size units have come back since end (every unit of the burst was
// taken before end); for a fixed window, in a window after end's; for
// a sliding counter, in a window whose previous window saw no unit.
func nextBurst(kind algo.Kind, shape burstShape, start, end time.Time) time.Time {
	next := start.Add(shape.every)
	per := burstPeriod.Microseconds()
	window := func(t time.Time, n int64) time.Time {
		return time.UnixMicro((t.UnixMicro()/per + n) * per).Add(shape.offset)
	}
	var free time.Time
	switch kind {
	case algo.TokenBucket, algo.GCRA:
		free = end.Add(time.Duration(shape.size)*burstPeriod/burstLimit + time.Millisecond)
	case algo.FixedWindow:
		free = window(end, 1)
	default:
		free = window(end, 2)
	}
	if free.After(next) {
		return free
	}
	return next
}

// burstOutcome counts what a client's bursts got.
type burstOutcome struct {
	sent, refused, errs atomic.Int64
	// degraded counts the refusals decided by the rule's fail mode (a
	// Redis call outlasted store.timeout); slow, the other refusals
	// answered later than timeout (when set): some call outlasted it.
	degraded, slow atomic.Int64
	timeout        time.Duration
	longest        atomic.Int64           // the longest burst, ns
	elapsed        atomic.Int64           // from the first burst to the last answer, ns
	first          atomic.Pointer[string] // the first refusal (answered within timeout, when set) or error
}

// onTime returns the refusals answered within timeout and not degraded:
// refusals while Redis answered within store.timeout.
func (o *burstOutcome) onTime() int64 {
	return o.refused.Load() - o.degraded.Load() - o.slow.Load()
}

func (o *burstOutcome) fail(what string) {
	o.first.CompareAndSwap(nil, &what)
}

// check sends one check of cost 1 of descs on c and counts its answer;
// what names the check in the first failure.
func (o *burstOutcome) check(c *client.Client, descs []client.Descriptor, what string) {
	o.sent.Add(1)
	start := time.Now()
	r, err := c.Check(context.Background(), descs, 1)
	took := time.Since(start)
	switch {
	case err != nil:
		o.errs.Add(1)
		o.fail(what + ": " + err.Error())
	case r.Allowed():
	case r.Degraded:
		o.refused.Add(1)
		o.degraded.Add(1)
	case o.timeout > 0 && took > o.timeout:
		o.refused.Add(1)
		o.slow.Add(1)
	default:
		o.refused.Add(1)
		o.fail(fmt.Sprintf("%s: %+v (answered in %v)", what, r, took.Round(time.Microsecond)))
	}
	if err == nil && !r.Allowed() && o.timeout == 0 {
		o.fail(fmt.Sprintf("%s: %+v", what, r))
	}
}

// sendBursts sends shape's bursts of checks of descs under an
// algorithm of kind, each burst's checks at once, round-robin over cs
// (burst i's check j goes to daemon (i+j) mod len(cs)), and counts the
// answers.
func sendBursts(cs []*client.Client, descs []client.Descriptor, kind algo.Kind, shape burstShape, o *burstOutcome) {
	per := burstPeriod.Microseconds()
	next := time.UnixMicro((time.Now().UnixMicro()/per + 1) * per).Add(shape.offset)
	first := next
	for i := range shape.n {
		time.Sleep(time.Until(next)) // pacing the load
		began := time.Now()
		var wg sync.WaitGroup
		for j := range shape.size {
			c := cs[(i+j)%len(cs)]
			wg.Go(func() { o.check(c, descs, fmt.Sprintf("burst %d", i)) })
		}
		wg.Wait()
		end := time.Now()
		storeMax(&o.longest, int64(end.Sub(began)))
		next = nextBurst(kind, shape, began, end)
	}
	o.elapsed.Store(int64(time.Since(first)))
}

// runBursts runs, for each algorithm of kinds in turn, its shapes at
// once, each with a client on a fresh key of the cached rule and one on
// the strict rule's, and asserts that neither is ever refused: the
// strict client shows that the exact algorithm admits the traffic, the
// cached one that leases refuse nothing the exact algorithm admits.
func runBursts(t *testing.T, socks []string, kinds []algo.Kind) {
	var cs []*client.Client
	for _, s := range socks {
		c := client.New(s)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	// The algorithms run at once, each on keys of its own.
	sent, admitted := recalls()
	t.Run("kinds", func(t *testing.T) {
		for _, k := range kinds {
			t.Run(k.String(), func(t *testing.T) {
				t.Parallel()
				type run struct {
					name string
					o    *burstOutcome
				}
				var runs []run
				var wg sync.WaitGroup
				for name, shape := range shapes(k) {
					for _, rule := range []string{k.String(), "strict-" + k.String()} {
						o := new(burstOutcome)
						runs = append(runs, run{rule + "/" + name, o})
						key := fmt.Sprintf("burst-%s-%s-%d", rule, name, time.Now().UnixNano())
						wg.Go(func() { sendBursts(cs, descs(rule, key), k, shape, o) })
					}
				}
				wg.Wait()
				for _, r := range runs {
					elapsed := time.Duration(r.o.elapsed.Load())
					t.Logf("%s: %d checks in %v (%.0f%% of the rate), %d refused (%d degraded), %d errors; longest burst %v", r.name, r.o.sent.Load(),
						elapsed.Round(time.Millisecond), 100*float64(r.o.sent.Load())/elapsed.Seconds()/(burstLimit/burstPeriod.Seconds()),
						r.o.refused.Load(), r.o.degraded.Load(), r.o.errs.Load(), time.Duration(r.o.longest.Load()).Round(time.Millisecond))
					if p := r.o.first.Load(); p != nil {
						t.Errorf("%s: first failure: %s", r.name, *p)
					}
					assert.GreaterOrEqual(t, r.o.sent.Load(), int64(2000), r.name)
					assert.Zero(t, r.o.refused.Load(), r.name)
					assert.Zero(t, r.o.errs.Load(), r.name)
				}
			})
		}
	})
	sent2, admitted2 := recalls()
	t.Logf("recalls sent %d, admitted after a recall %d (this process's daemons, every algorithm)", sent2-sent, admitted2-admitted)
}

// recalls returns the recalls the daemons of this process sent, and
// those after which the refused take was admitted.
func recalls() (sent, admitted int64) {
	var b bytes.Buffer
	metrics.WritePrometheus(&b, false)
	for _, line := range strings.Split(b.String(), "\n") {
		name, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch name {
		case `rld_cache_recalls_total{event="sent"}`:
			sent = n
		case `rld_cache_recalls_total{event="admitted"}`:
			admitted = n
		}
	}
	return sent, admitted
}

// TestCachedBurstsNoFalseRejections: three daemons on one Redis, a client
// sending bursts round-robin over their sockets, within what the exact
// algorithm admits (80% of the capacity every period, or the whole
// capacity as often as it refills; see shapes), starting on a fresh key:
// the cached rules refuse no check, for every algorithm that leases, as
// the strict rules refuse none. Units parked in the other daemons'
// leases are recalled, not refused.
func TestCachedBurstsNoFalseRejections(t *testing.T) {
	srv := redistest.Standalone(t)
	fleet := startFleet(t, 3, burstConfig(fmt.Sprintf("redis = [%q]", srv.Addr), fleetTimeout))
	var socks []string
	for _, s := range fleet {
		socks = append(socks, s.Socket)
	}
	runBursts(t, socks, burstKinds)
}

// TestCachedFullBurstsDefaultTimeout: three daemons on one Redis at the
// default store.timeout, a client sending bursts of the whole capacity
// round-robin over their sockets as often as the exact algorithm admits
// them (a bucket's every 1.25 periods, 80% of its rate; see shapes),
// for each algorithm that leases in turn: the strict rule on the same
// traffic, the control, refuses no check while Redis answers within
// store.timeout, and neither does the cached rule: at a burst's edge,
// the units another daemon leased by a call that was out when the
// recall came go back as they come (docs/cache.md, "Leases never refuse
// a client under its limit"). A refusal that is
// degraded (decided by the fail mode: a Redis call outlasted
// store.timeout), or answered later than store.timeout (some call
// outlasted it: a recall's round trips no longer fit), is counted and
// logged, not failed: on a loaded two-core host under -race, calls of
// 10 ms and more are common. Each algorithm runs burstSeconds (3 s;
// RLD_BURST_SECONDS sets it, 60 for the soak); RLD_BURST_TIMEOUT sets
// another store.timeout, to compare.
func TestCachedFullBurstsDefaultTimeout(t *testing.T) {
	srv := redistest.Standalone(t)
	timeout := burstTimeout(t)
	fleet := startFleet(t, 3, burstConfig(fmt.Sprintf("redis = [%q]", srv.Addr), os.Getenv("RLD_BURST_TIMEOUT")))
	waitPeers(t, fleet)
	cs := daemonClients(t, fleet)
	run := burstSeconds(t)
	for _, k := range burstKinds {
		t.Run(k.String(), func(t *testing.T) {
			shape := shapes(k)["capacity"]
			shape.n = max(int(run/shape.every), 2)
			cached, strict := burstOutcome{timeout: timeout}, burstOutcome{timeout: timeout}
			key := fmt.Sprintf("full-%s-%d", k, time.Now().UnixNano())
			var wg sync.WaitGroup
			wg.Go(func() { sendBursts(cs, descs(k.String(), key), k, shape, &cached) })
			wg.Go(func() { sendBursts(cs, descs("strict-"+k.String(), key), k, shape, &strict) })
			sent, admitted := recalls()
			late := lateAnswers()
			wg.Wait()
			sent2, admitted2 := recalls()
			for name, o := range map[string]*burstOutcome{"cached": &cached, "strict": &strict} {
				elapsed := time.Duration(o.elapsed.Load())
				t.Logf("%s %s: %d checks in %v (%.0f%% of the rate), %d refused (%d degraded, %d answered after store.timeout), %d errors; longest burst %v",
					k, name, o.sent.Load(), elapsed.Round(time.Millisecond),
					100*float64(o.sent.Load())/elapsed.Seconds()/(burstLimit/burstPeriod.Seconds()),
					o.refused.Load(), o.degraded.Load(), o.slow.Load(), o.errs.Load(), time.Duration(o.longest.Load()).Round(time.Millisecond))
				if p := o.first.Load(); p != nil {
					t.Logf("%s: first refusal within store.timeout, or error: %s", name, *p)
				}
				assert.EqualValues(t, shape.n*shape.size, o.sent.Load(), name)
				assert.Zero(t, o.errs.Load(), name)
				assert.Zero(t, o.onTime(), "%s: refused while Redis answered within store.timeout", name)
			}
			t.Logf("%s: recalls sent %d, admitted after a recall %d; late answers %d; units counted out on lease in Redis after the run %d (capacity %d)",
				k, sent2-sent, admitted2-admitted, lateAnswers()-late, unitsOut(t, srv.Addr, key), burstLimit)
		})
	}
}

// burstSeconds returns how long TestCachedFullBurstsDefaultTimeout runs
// each algorithm: RLD_BURST_SECONDS, or 3 s.
func burstSeconds(t *testing.T) time.Duration {
	v := os.Getenv("RLD_BURST_SECONDS")
	if v == "" {
		return 3 * time.Second
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "RLD_BURST_SECONDS")
	return time.Duration(n) * time.Second
}

// burstTimeout returns the store.timeout of
// TestCachedFullBurstsDefaultTimeout: RLD_BURST_TIMEOUT (to compare
// others with the default), or the default.
func burstTimeout(t *testing.T) time.Duration {
	v := os.Getenv("RLD_BURST_TIMEOUT")
	if v == "" {
		return redisx.DefaultTimeout
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "RLD_BURST_TIMEOUT")
	return d
}

// daemonClients returns a client of each daemon of fleet.
func daemonClients(t *testing.T, fleet []*daemontest.Server) []*client.Client {
	var cs []*client.Client
	for _, s := range fleet {
		c := client.New(s.Socket)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	return cs
}

// waitPeers waits until every daemon of fleet counts them all live (its
// heartbeat's count, which caps its leases at a share of the key's
// remaining quota): a fleet that has been up a second or more.
func waitPeers(t *testing.T, fleet []*daemontest.Server) {
	require.Eventually(t, func() bool {
		for _, s := range fleet {
			if s.Daemon.LivePeers() != len(fleet) {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "every daemon counts %d live daemons", len(fleet))
}

// unitsOut returns the units the daemons have out on lease, as Redis at
// addr counts them, of the cached rule's keys whose counter key holds
// key (docs/cache.md: the key's hash <key>:out).
func unitsOut(t *testing.T, addr, key string) int64 {
	keys, err := redistest.Do(addr, "KEYS", "*"+key+"*:out")
	require.NoError(t, err)
	var n int64
	for _, k := range strings.Fields(keys) {
		v, err := redistest.Do(addr, "HGETALL", k)
		require.NoError(t, err)
		for _, f := range strings.Fields(v) {
			if units, _, ok := strings.Cut(f, ":"); ok {
				u, _ := strconv.ParseInt(units, 10, 64)
				n += u
			}
		}
	}
	return n
}

// lateAnswers returns rld_cache_late_answers_total, counted by the
// daemons of this process.
func lateAnswers() int64 {
	var b bytes.Buffer
	metrics.WritePrometheus(&b, false)
	for _, line := range strings.Split(b.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "rld_cache_late_answers_total "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// TestCachedBurstsNoFalseRejectionsCluster: the same for the token
// bucket on a Redis Cluster of three primaries (the recalls cross the
// Cluster's pub/sub).
func TestCachedBurstsNoFalseRejectionsCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	store := clusterStore(cl)
	fleet := startFleet(t, 3, burstConfig(store, fleetTimeout))
	var socks []string
	for _, s := range fleet {
		socks = append(socks, s.Socket)
	}
	runBursts(t, socks, []algo.Kind{algo.TokenBucket})
}

// TestCachedBurstTakesParkedWarmLeases: a key far from its limit, seen
// once on each of three daemons, holds a warm lease on each (the warm
// floor capped at a sixth of what is left, under a capacity of 1,000);
// then everything left in the bucket comes to one daemon at once. The
// exact algorithm admits it whole (the strict rule's client shows it
// for the token bucket), and so must the cached rules: the units parked
// on the other two daemons are recalled, not refused. The period is a minute, so that the
// bucket's refill during the burst is far less than what is parked.
func TestCachedBurstTakesParkedWarmLeases(t *testing.T) {
	srv := redistest.Standalone(t)
	const limit, period = 1_000, time.Minute
	fleet := startFleet(t, 3, cacheConfig(fmt.Sprintf("redis = [%q]", srv.Addr), limit, period))
	var cs []*client.Client
	for _, s := range fleet {
		c := client.New(s.Socket)
		t.Cleanup(func() { c.Close() })
		cs = append(cs, c)
	}
	for _, alg := range []string{"token_bucket", "gcra", "strict"} {
		t.Run(alg, func(t *testing.T) {
			key := fmt.Sprintf("parked-%s-%d", alg, time.Now().UnixNano())
			d := descs(alg, key)
			for i, c := range cs {
				r, err := c.Check(context.Background(), d, 1)
				require.NoError(t, err)
				require.True(t, r.Allowed(), "daemon %d's first check", i)
			}
			sent, _ := recalls()
			var o burstOutcome
			var wg sync.WaitGroup
			for range limit - len(cs) {
				wg.Go(func() { o.check(cs[0], d, "the burst") })
			}
			wg.Wait()
			sent2, _ := recalls()
			t.Logf("%s: %d checks at once on one daemon, %d refused, %d errors; recalls sent %d", alg, o.sent.Load(), o.refused.Load(), o.errs.Load(), sent2-sent)
			if p := o.first.Load(); p != nil {
				t.Errorf("first failure: %s", *p)
			}
			assert.EqualValues(t, limit-len(cs), o.sent.Load())
			assert.Zero(t, o.refused.Load())
			assert.Zero(t, o.errs.Load())
			if alg != "strict" {
				assert.Positive(t, sent2-sent, "the parked units were recalled")
			}
			// The bucket is about empty: a cost of 100 needs 6 s of refill.
			r, err := cs[0].Check(context.Background(), d, 100)
			require.NoError(t, err)
			assert.False(t, r.Allowed(), "a cost of 100 after the burst: %+v", r)
		})
	}
}

// TestTimedOutGrantGoesBack: a daemon at the default store.timeout, its
// Redis behind a proxy. Its first check of a key far from its limit asks
// for a warm lease while the proxy delays everything 60 ms: the call
// outlasts store.timeout, the check is answered by the fail mode, and
// Redis runs the call after the daemon stopped waiting, counting the
// units it leased out on the daemon's lease, which the daemon never got.
// Once Redis answers in time again, those units go back: Redis counts
// none out two sync intervals later, where it counted them for the warm
// lease's lifetime (5 min), recalled in vain by every refusal of the
// key at its limit (docs/cache.md, "Units nobody holds").
func TestTimedOutGrantGoesBack(t *testing.T) {
	srv := redistest.Standalone(t)
	for _, k := range []algo.Kind{algo.TokenBucket, algo.GCRA} {
		t.Run(k.String(), func(t *testing.T) {
			// The setup is up to timing (the call must reach Redis after
			// its check stopped waiting, and nothing else may open the
			// daemon's breaker meanwhile): tried on a fresh daemon up to
			// five times until Redis counts the lost lease out.
			for attempt := 0; ; attempt++ {
				require.Less(t, attempt, 5, "no take-with-lease ran in Redis after its check's timeout")
				if key, ok := lostGrant(t, srv.Addr, k); ok {
					require.Eventually(t, func() bool { return unitsOut(t, srv.Addr, key) == 0 }, 5*time.Second, 5*time.Millisecond,
						"the lease the daemon never got went back")
					return
				}
			}
		})
	}
}

// lostGrant starts a daemon whose Redis at addr is behind a proxy, with
// a sync interval of a second (the units go back two intervals after
// the call, so that the test sees them out first), and sends its first
// check of a fresh key of kind's cached rule while the proxy delays
// everything 60 ms. It returns the key, and whether Redis then counted
// units out on lease for it (the call ran after the daemon stopped
// waiting), the proxy fast again.
func lostGrant(t *testing.T, addr string, k algo.Kind) (string, bool) {
	proxy := redistest.StartProxy(t, addr)
	config := strings.Replace(burstConfig(fmt.Sprintf("redis = [%q]", proxy.Addr()), ""), `sync_interval = "100ms"`, `sync_interval = "1s"`, 1)
	d := startFleet(t, 1, config)[0]
	c := client.New(d.Socket)
	t.Cleanup(func() { c.Close() })
	key := fmt.Sprintf("lost-%s-%d", k, time.Now().UnixNano())
	proxy.Delay(60 * time.Millisecond)
	defer proxy.Delay(0)
	r, err := c.Check(context.Background(), descs(k.String(), key), 1)
	require.NoError(t, err)
	require.True(t, r.Degraded, "answered by the fail mode: %+v", r)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if unitsOut(t, addr, key) > 0 {
			return key, true
		}
	}
	return key, false
}
