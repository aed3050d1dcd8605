package daemon_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
	"github.com/rld/rld/wire"
)

// fleetKinds are the algorithms the fleet tests run, each under a rule
// named after it.
var fleetKinds = []algo.Kind{algo.TokenBucket, algo.GCRA, algo.SlidingLog, algo.SlidingCounter, algo.FixedWindow}

// fleetPeriod is every fleet rule's period: the test runs fleetWindows of
// them, starting on an epoch-aligned window boundary.
const (
	fleetPeriod  = 500 * time.Millisecond
	fleetWindows = 6
	// fleetOverload is how many times its limit each key is offered.
	fleetOverload = 5
	// fleetClients is how many client connections per daemon hammer
	// each key: the daemon answers a connection's requests in order.
	fleetClients = 4
	// fleetTimeout is store.timeout of the fleet's daemons: generous, so
	// that a loaded two-core machine running -race causes no errors.
	fleetTimeout = "500ms"
)

// fleetConfig returns rld.toml for a fleet daemon: one rule per
// algorithm in mode (sliding_log is always strict), selected by the
// descriptor alg, counting by api_key; and two strict hierarchical rules
// for alg=hier, per api_key and per tenant.
func fleetConfig(store string, limit int64, mode string) string {
	return fleetConfigPeriod(store, limit, mode, fleetPeriod)
}

// fleetConfigPeriod is fleetConfig with the rules' period.
func fleetConfigPeriod(store string, limit int64, mode string, period time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nmax_connections = 1000\n\n[store]\n%s\ntimeout = %q\n", store, fleetTimeout)
	for _, k := range fleetKinds {
		m := mode
		if k == algo.SlidingLog {
			m = "strict"
		}
		fmt.Fprintf(&b, "\n[[rule]]\nname = %q\nmatch = { alg = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = %d\nperiod = %q\nmode = %q\n",
			k.String(), k.String(), k.String(), limit, period.String(), m)
	}
	b.WriteString(hierRules)
	return b.String()
}

// hierRules: a request with alg=hier takes from its api_key's counter,
// then from its tenant's, whose limit depends on the tier.
const hierRules = `
[[rule]]
name = "hier-key"
match = { alg = "hier" }
by = ["api_key"]
limit = 100
period = "1h"
mode = "strict"

[[rule]]
name = "hier-tenant"
match = { alg = "hier" }
by = ["tenant"]
tiers = { small = 1, big = 1000 }
period = "1h"
mode = "strict"
`

// counterKey is the counter key policy builds for rule name and one by
// value: the name, a zero byte, the uvarint length of the value, the
// value.
func counterKey(rule, value string) []byte {
	k := append([]byte(rule), 0)
	k = binary.AppendUvarint(k, uint64(len(value)))
	return append(k, value...)
}

// fleetKey is one key the fleet hammers, and what happened to it.
type fleetKey struct {
	kind   algo.Kind
	apiKey string

	sent, admitted, limited, errs atomic.Int64
	// degraded counts the admissions made on a daemon's local state
	// alone while its Redis did not answer (fail open at the fair
	// share): Redis never counted them, so they are outside the bound.
	degraded    atomic.Int64
	lost        atomic.Int64 // connection errors from a killed daemon
	firstErr    atomic.Pointer[string]
	first, last atomic.Int64 // unix µs: first send, last answer
}

// bound is the most the algorithm may admit for a fresh key between the
// first request sent at first and the last answer received at last (unix
// µs; Redis's clock is this host's). Every admission happened in Redis
// between the two.
func (k *fleetKey) bound(p algo.Params) int64 {
	first, last := k.first.Load(), k.last.Load()
	per := p.PeriodMicros()
	switch p.Kind {
	case algo.TokenBucket:
		// admitted×P ≤ C×P + elapsed×L
		return p.Capacity() + (last-first)*p.Limit/per
	case algo.GCRA:
		// admitted×e ≤ C×e + elapsed, e = ⌈P/L⌉
		e := (per + p.Limit - 1) / p.Limit
		return p.Capacity() + (last-first)/e
	case algo.SlidingLog:
		// At most L in any (t−P, t]: [first, last] is covered by
		// ⌈(last−first+1)/P⌉ such spans.
		return p.Limit * ((last - first + per) / per)
	default:
		// Fixed window, sliding counter: at most L in each
		// epoch-aligned window touched (the counter's estimate never
		// lets a window's own count pass L).
		return p.Limit * (last/per - first/per + 1)
	}
}

// fleetOptions vary runFleet.
type fleetOptions struct {
	// mode is the rules' mode: "strict" or "cached".
	mode string
	// kill runs the third daemon as a process and SIGKILLs it halfway:
	// its leases are never returned.
	kill bool
}

// runFleet starts three daemons on store (a [store] body), hammers every
// key at fleetOverload× its limit from fleetClients connections per
// daemon, for fleetWindows periods starting on a window boundary, and
// checks each key's admissions against its algorithm's exact bound. It
// returns the sockets of the daemons still running.
func runFleet(t *testing.T, store string, limit int64, keys []*fleetKey, o fleetOptions) []string {
	cfg := fleetConfig(store, limit, o.mode)
	var fleet []string
	for range 2 {
		s, err := daemontest.Start(cfg)
		require.NoError(t, err)
		t.Cleanup(s.Close)
		fleet = append(fleet, s.Socket)
	}
	var victim *daemontest.Process
	if o.kill {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		victim = p
		fleet = append(fleet, p.Socket)
	} else {
		s, err := daemontest.Start(cfg)
		require.NoError(t, err)
		t.Cleanup(s.Close)
		fleet = append(fleet, s.Socket)
	}
	// Warm up every connection (and the script cache) on other keys.
	type conn struct {
		c      *client.Client
		k      *fleetKey
		victim bool // on the daemon that is killed
	}
	var conns []conn
	for _, k := range keys {
		for i, sock := range fleet {
			for range fleetClients {
				c := client.New(sock)
				t.Cleanup(func() { c.Close() })
				r, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "warm-up"}, {Name: "alg", Value: k.kind.String()}}, 1)
				require.NoError(t, err)
				require.Equal(t, k.kind.String(), r.Rule, "warm-up: %+v", r)
				conns = append(conns, conn{c, k, victim != nil && i == len(fleet)-1})
			}
		}
	}

	// Start just after a window boundary and stop just before the last
	// window ends, so that every window is hammered from its start to
	// its end.
	t0 := time.Now().Truncate(fleetPeriod).Add(fleetPeriod + 2*time.Millisecond)
	end := t0.Truncate(fleetPeriod).Add(fleetWindows*fleetPeriod - 15*time.Millisecond)
	perKey := len(fleet) * fleetClients
	rate := float64(fleetOverload*limit) / fleetPeriod.Seconds() // per key, per second
	interval := time.Duration(float64(time.Second) * float64(perKey) / rate)
	var killed atomic.Bool
	if victim != nil {
		time.AfterFunc(time.Until(t0.Add(fleetWindows*fleetPeriod/2)), func() {
			killed.Store(true)
			victim.Kill()
		})
	}
	var wg sync.WaitGroup
	for i, cn := range conns {
		offset := time.Duration(i%perKey) * interval / time.Duration(perKey)
		descs := []client.Descriptor{{Name: "api_key", Value: cn.k.apiKey}, {Name: "alg", Value: cn.k.kind.String()}}
		wg.Go(func() {
			k := cn.k
			for next := t0.Add(offset); next.Before(end); next = next.Add(interval) {
				time.Sleep(time.Until(next)) // pacing the load, not synchronising
				storeMin(&k.first, time.Now().UnixMicro())
				k.sent.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := cn.c.Check(ctx, descs, 1)
				cancel()
				storeMax(&k.last, time.Now().UnixMicro())
				if cn.victim && killed.Load() {
					if err != nil { // its daemon is gone: nothing more to send
						k.lost.Add(1)
						return
					}
				}
				switch {
				case err != nil || r.Rule != k.kind.String() || (!r.Allowed() && r.Status != wire.StatusLimited):
					if k.errs.Add(1) == 1 {
						msg := fmt.Sprintf("%v %+v", err, r)
						k.firstErr.Store(&msg)
					}
				case r.Allowed() && r.Degraded:
					k.degraded.Add(1)
				case r.Allowed():
					k.admitted.Add(1)
				default:
					k.limited.Add(1)
				}
			}
		})
	}
	wg.Wait()

	byKind := map[algo.Kind][2]int64{} // admitted, what whole windows allow
	for _, k := range keys {
		p := algo.Params{Kind: k.kind, Limit: limit, Period: fleetPeriod}
		bound := k.bound(p)
		elapsed := time.Duration(k.last.Load()-k.first.Load()) * time.Microsecond
		offered := float64(k.sent.Load()) / elapsed.Seconds() / (float64(limit) / fleetPeriod.Seconds())
		t.Logf("%-15s key %-10s sent %5d (%.1f× the limit) over %v: admitted %4d, bound %4d, ratio %.3f, errors %d, lost with the killed daemon %d, admitted degraded (Redis unanswered) %d",
			k.kind, k.apiKey, k.sent.Load(), offered, elapsed.Round(time.Millisecond), k.admitted.Load(), bound,
			float64(k.admitted.Load())/float64(bound), k.errs.Load(), k.lost.Load(), k.degraded.Load())
		if p := k.firstErr.Load(); p != nil {
			t.Errorf("%s %s: %d errors; first: %s", k.kind, k.apiKey, k.errs.Load(), *p)
		}
		assert.LessOrEqual(t, k.admitted.Load(), bound, "%s %s: admitted more than the exact bound", k.kind, k.apiKey)
		// Sent at 5× the limit; each connection waits for its answers, so
		// a loaded host offers less: twice the limit still overloads the key.
		assert.GreaterOrEqual(t, offered, 2.0, "%s %s: the load fell short of overloading the key", k.kind, k.apiKey)
		// The floor below compares with what the run's whole windows
		// allow: the exact bound also counts a window the last answers
		// reach into by a few milliseconds.
		full := bound
		if k.kind != algo.TokenBucket && k.kind != algo.GCRA {
			full = min(bound, limit*fleetWindows)
		}
		v := byKind[k.kind]
		byKind[k.kind] = [2]int64{v[0] + k.admitted.Load(), v[1] + full}
	}
	for _, kind := range fleetKinds {
		v := byKind[kind]
		ratio := float64(v[0]) / float64(v[1])
		t.Logf("%-15s admitted/bound = %d/%d = %.3f", kind, v[0], v[1], ratio)
		// Not far below the bound either: the fleet does not lose
		// quota. (The sliding counter's estimate admits a little less
		// than its per-window bound by design.)
		// A killed daemon's leases are lost to its keys.
		floor := 0.85
		if o.kill {
			floor = 0.7
		}
		assert.Greater(t, ratio, floor, "%s: admitted far below the bound", kind)
	}
	if victim != nil {
		return fleet[:len(fleet)-1]
	}
	return fleet
}

// storeMin sets v to x when v is 0 or above x.
func storeMin(v *atomic.Int64, x int64) {
	for old := v.Load(); (old == 0 || x < old) && !v.CompareAndSwap(old, x); old = v.Load() {
	}
}

// storeMax sets v to x when v is below x.
func storeMax(v *atomic.Int64, x int64) {
	for old := v.Load(); x > old && !v.CompareAndSwap(old, x); old = v.Load() {
	}
}

// TestFleetStandalone: three daemons share one Redis; one key per
// algorithm is hammered through all three at 5× its limit. No algorithm
// admits more than its exact bound, and none much less.
func TestFleetStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	var keys []*fleetKey
	for _, k := range fleetKinds {
		keys = append(keys, &fleetKey{kind: k, apiKey: "sk_fleet"})
	}
	for _, mode := range []string{"cached", "strict"} {
		t.Run(mode, func(t *testing.T) {
			keys := make([]*fleetKey, len(keys))
			for i, k := range fleetKinds {
				keys[i] = &fleetKey{kind: k, apiKey: "sk_fleet_" + mode}
			}
			runFleet(t, fmt.Sprintf("redis = [%q]", srv.Addr), 50, keys, fleetOptions{mode: mode})
		})
	}
}

// TestFleetKill: three daemons with cached rules, one of them a process
// SIGKILLed halfway through with its leases: still never over the bound.
func TestFleetKill(t *testing.T) {
	srv := redistest.Standalone(t)
	var keys []*fleetKey
	for _, k := range fleetKinds {
		keys = append(keys, &fleetKey{kind: k, apiKey: "sk_kill"})
	}
	runFleet(t, fmt.Sprintf("redis = [%q]", srv.Addr), 50, keys, fleetOptions{mode: "cached", kill: true})
}

// TestFleetCluster: the same against a Cluster, each algorithm with one
// key on each of the three primaries.
func TestFleetCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	primaries := cl.Primaries()
	require.Len(t, primaries, 3)
	store := clusterStore(cl)
	var keys []*fleetKey
	for _, mode := range []string{"cached", "strict"} {
		keys = nil
		for _, kind := range fleetKinds {
			// One api_key per primary: the first whose Redis key's slot
			// the primary serves.
			for _, primary := range primaries {
				for i := 0; ; i++ {
					require.Less(t, i, 1000, "no key found for %s", primary.Addr)
					v := fmt.Sprintf("sk_%s_%d", mode, i)
					rkey := redisx.AppendKey(nil, "rld:", counterKey(kind.String(), v), kind)
					if cl.PrimaryFor(string(rkey)) == primary {
						keys = append(keys, &fleetKey{kind: kind, apiKey: v})
						break
					}
				}
			}
		}
		t.Run(mode, func(t *testing.T) {
			runFleet(t, store, 20, keys, fleetOptions{mode: mode})
		})
	}

	// The keys are where the slot helper says: the daemons built the
	// keys the test computed, and the three shards shared the work.
	for _, k := range keys {
		rkey := string(redisx.AppendKey(nil, "rld:", counterKey(k.kind.String(), k.apiKey), k.kind))
		n, err := redistest.Do(cl.PrimaryFor(rkey).Addr, "EXISTS", rkey)
		require.NoError(t, err)
		assert.Equal(t, "1", n, "%q on %s", rkey, cl.PrimaryFor(rkey).Addr)
	}

	// Hierarchical rules whose counters live on different primaries: the
	// tenant's rule denies, and the api_key's take is refunded on the
	// other shard.
	primaryOf := func(rule, value string) *redistest.Server {
		return cl.PrimaryFor(string(redisx.AppendKey(nil, "rld:", counterKey(rule, value), algo.TokenBucket)))
	}
	apiKey, tenant := "sk_hier", ""
	for i := 0; tenant == ""; i++ {
		require.Less(t, i, 1000)
		if v := fmt.Sprintf("tenant_%d", i); primaryOf("hier-tenant", v) != primaryOf("hier-key", apiKey) {
			tenant = v
		}
	}
	d := start(t, fleetConfig(store, 20, "strict"))
	c := client.New(d.Socket)
	defer c.Close()
	hier := func(tenant, tier string) []client.Descriptor {
		return []client.Descriptor{{Name: "api_key", Value: apiKey}, {Name: "tenant", Value: tenant}, {Name: "tier", Value: tier}, {Name: "alg", Value: "hier"}}
	}
	r, err := c.Check(context.Background(), hier(tenant, "small"), 1)
	require.NoError(t, err)
	require.True(t, r.Allowed(), "%+v", r)
	for range 3 {
		r, err = c.Check(context.Background(), hier(tenant, "small"), 1)
		require.NoError(t, err)
		require.Equal(t, wire.StatusLimited, r.Status, "%+v", r)
		require.Equal(t, "hier-tenant", r.Rule)
	}
	// A peek under another tenant with room shows the api_key's counter:
	// 100 − 1 taken − 1 peeked = 98, not 95: the three denied checks'
	// takes were refunded.
	r, err = c.Peek(context.Background(), hier("other", "big"), 1)
	require.NoError(t, err)
	assert.Equal(t, "hier-key", r.Rule)
	assert.Equal(t, uint64(98), r.Remaining, "refunds across shards")
}

// clusterStore returns the [store] lines of a daemon on the Cluster cl.
func clusterStore(cl *redistest.Cluster) string {
	return fmt.Sprintf("redis = [%s]\nmode = \"cluster\"", quotedList(cl.Addrs()))
}

// quotedList returns addrs as the items of a TOML array of strings.
func quotedList(addrs []string) string {
	return `"` + strings.Join(addrs, `", "`) + `"`
}
