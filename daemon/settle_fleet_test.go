package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
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

// The settle fleet's limits: a token bucket of settleCapacity units that
// refills one unit every 36 s, so that a run of a few seconds refills
// less than one.
const (
	settleCapacity = 10000
	settlePeriod   = 100 * time.Hour
	settleCallers  = 10
	settleRequests = 30 // per caller and mode
)

func settleConfig(store, keyFile, mode string) string {
	return fmt.Sprintf(`[server]
max_connections = 1000

[store]
%s
timeout = %q
lease_key_file = %q

[[rule]]
name = "settle-strict"
match = { alg = "strict" }
by = ["api_key"]
limit = %d
period = %q
mode = "strict"

[[rule]]
name = "settle-cached"
match = { alg = "cached" }
by = ["api_key"]
limit = %d
period = %q
mode = %q
`, store, fleetTimeout, keyFile, settleCapacity, settlePeriod, settleCapacity, settlePeriod, mode)
}

// TestSettleFleet: three daemons on one Redis with one lease key; callers
// acquire at an estimate of 1 and settle at random actual costs, through
// any daemon, while one daemon is restarted: each key is charged exactly
// the sum of the actual costs (within the refill of the run), through a
// strict rule and a cached one.
func TestSettleFleet(t *testing.T) {
	srv := redistest.Standalone(t)
	runSettleFleet(t, fmt.Sprintf("redis = [%q]", srv.Addr), []string{"sk_settle"})
}

// TestSettleFleetCluster: the same on a Cluster, with one key on each of
// its three primaries.
func TestSettleFleetCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	primaries := cl.Primaries()
	require.Len(t, primaries, 3)
	var keys []string
	for _, primary := range primaries {
		for i := 0; ; i++ {
			require.Less(t, i, 1000, "no key found for %s", primary.Addr)
			v := fmt.Sprintf("sk_settle_%d", i)
			// The strict rule's counter on each primary (the cached
			// rule's fall where its name puts them).
			rkey := redisx.AppendKey(nil, "rld:", counterKey("settle-strict", v), algo.TokenBucket)
			if cl.PrimaryFor(string(rkey)) == primary {
				keys = append(keys, v)
				break
			}
		}
	}
	store := clusterStore(cl)
	runSettleFleet(t, store, keys)
}

// runSettleFleet runs the settle fleet on store, the callers spread over
// the api keys.
func runSettleFleet(t *testing.T, store string, keys []string) {
	keyFile := filepath.Join(t.TempDir(), "lease.key")
	require.NoError(t, os.WriteFile(keyFile, []byte("a lease key shared by the fleet\n"), 0o600))
	cfg := settleConfig(store, keyFile, "cached")
	var fleet []*daemontest.Process
	for range 3 {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		fleet = append(fleet, p)
	}
	clients := make([]*client.Client, len(fleet))
	for i, p := range fleet {
		clients[i] = client.New(p.Socket)
		t.Cleanup(func() { clients[i].Close() })
	}
	ctx := context.Background()
	modes := []string{"strict", "cached"}
	descs := func(key, mode string) []client.Descriptor {
		return []client.Descriptor{{Name: "api_key", Value: key}, {Name: "alg", Value: mode}}
	}

	// Daemon 0 is restarted halfway: while it is, no call is sent to it
	// (inFlight counts those under way), and the leases it gave are
	// settled through the others, or through it once it is back.
	var restarting atomic.Bool
	var inFlight [3]atomic.Int64
	var done atomic.Int64
	sums := make([][2]atomic.Int64, len(keys)) // the actual costs settled, by key and mode
	pick := func(rng *rand.Rand) int {
		for {
			i := rng.IntN(len(clients))
			inFlight[i].Add(1)
			if i == 0 && restarting.Load() {
				inFlight[i].Add(-1)
				continue
			}
			return i
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for c := range settleCallers {
		for m, mode := range modes {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(c), uint64(m)))
				k := c % len(keys)
				for range settleRequests {
					i := pick(rng)
					r, err := clients[i].Acquire(ctx, descs(keys[k], mode), 1)
					inFlight[i].Add(-1)
					if err != nil || !r.Allowed() || r.Lease == "" {
						t.Errorf("%s: acquire through daemon %d: %+v, %v", mode, i, r, err)
						return
					}
					actual := 1 + rng.Int64N(20)
					for {
						j := pick(rng)
						_, err := clients[j].Settle(ctx, r.Lease, uint32(actual))
						inFlight[j].Add(-1)
						if errors.Is(err, client.ErrConnLost) {
							continue // the daemon went away meanwhile: settle elsewhere
						}
						if err != nil {
							t.Errorf("%s: settle through daemon %d: %v", mode, j, err)
							return
						}
						break
					}
					sums[k][m].Add(actual)
					done.Add(1)
				}
			})
		}
	}
	// Restart daemon 0 (SIGTERM: it returns its leases) once a third of
	// the requests are done.
	for done.Load() < settleCallers*settleRequests*2/3 && !t.Failed() {
		time.Sleep(5 * time.Millisecond) // polling the callers' progress
	}
	restarting.Store(true)
	for inFlight[0].Load() > 0 {
		time.Sleep(time.Millisecond) // polling for its calls to end
	}
	require.NoError(t, fleet[0].Term(10*time.Second))
	require.NoError(t, fleet[0].Restart())
	restarting.Store(false)
	wg.Wait()
	elapsed := time.Since(start)

	// The cached daemons return their leases when they stop.
	for _, p := range fleet {
		require.NoError(t, p.Term(10*time.Second))
	}
	checker := start1(t, settleConfig(store, keyFile, "strict"))
	c := client.New(checker.Socket)
	defer c.Close()
	refill := int64(elapsed/(settlePeriod/settleCapacity)) + 1
	for k, key := range keys {
		for m, mode := range modes {
			r, err := c.Peek(ctx, descs(key, mode), 1)
			require.NoError(t, err)
			charged := int64(settleCapacity) - int64(r.Remaining) - 1 // the peek counts its unit
			sum := sums[k][m].Load()
			t.Logf("%s %s: settled %d units, charged %d (refill of the run: at most %d)", key, mode, sum, charged, refill)
			assert.LessOrEqual(t, charged, sum, "%s %s: charged more than settled", key, mode)
			assert.GreaterOrEqual(t, charged, sum-refill, "%s %s: charged less than settled", key, mode)
		}
	}
}

// start1 starts an in-process daemon on config.
func start1(t *testing.T, config string) *daemontest.Server {
	t.Helper()
	s, err := daemontest.Start(config)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

// TestSettleEveryAlgorithm: on Redis, every rate algorithm is charged and
// refunded a settle's difference exactly, and a settle into debt refuses
// the key's checks. (Strict rules: a cached rule's daemon answers from its
// lease, counted in Redis already, until it runs out; TestSettleFleet
// measures the cached rules' charges in Redis.)
func TestSettleEveryAlgorithm(t *testing.T) {
	srv := redistest.Standalone(t)
	var b strings.Builder
	fmt.Fprintf(&b, "[store]\nredis = [%q]\ntimeout = %q\n", srv.Addr, fleetTimeout)
	for _, k := range fleetKinds {
		for _, mode := range []string{"strict"} {
			fmt.Fprintf(&b, "\n[[rule]]\nname = \"%s-%s\"\nmatch = { alg = %q, mode = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = 100\nperiod = \"1h\"\nmode = %q\n",
				k, mode, k, mode, k, mode)
		}
	}
	s := start1(t, b.String())
	c := client.New(s.Socket)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	for _, k := range fleetKinds {
		for _, mode := range []string{"strict"} {
			t.Run(k.String()+"/"+mode, func(t *testing.T) {
				descs := []client.Descriptor{{Name: "api_key", Value: "sk_every"}, {Name: "alg", Value: k.String()}, {Name: "mode", Value: mode}}
				remaining := func() uint64 {
					t.Helper()
					r, err := c.Peek(ctx, descs, 1)
					require.NoError(t, err)
					return r.Remaining + 1 // the peek counts its unit
				}
				a, err := c.Acquire(ctx, descs, 10)
				require.NoError(t, err)
				require.True(t, a.Allowed(), "%+v", a)
				_, err = c.Settle(ctx, a.Lease, 25)
				require.NoError(t, err)
				assert.Equal(t, uint64(75), remaining(), "charged 15 more")
				a, err = c.Acquire(ctx, descs, 10)
				require.NoError(t, err)
				_, err = c.Settle(ctx, a.Lease, 4)
				require.NoError(t, err)
				assert.Equal(t, uint64(71), remaining(), "refunded 6")
				a, err = c.Acquire(ctx, descs, 1)
				require.NoError(t, err)
				_, err = c.Settle(ctx, a.Lease, 100)
				require.NoError(t, err)
				r, err := c.Check(ctx, descs, 1)
				require.NoError(t, err)
				assert.Equal(t, wire.StatusLimited, r.Status, "in debt")
				assert.Positive(t, r.RetryAfter)
			})
		}
	}
}

// onceConfig: a request with the descriptors of onceDescs counts under
// two strict rate rules (a token bucket and a fixed window), one in mode
// (cached in the fleet), and a concurrency limit of one slot; each rule
// matches a descriptor of its own, so that a peek can ask one of them.
func onceConfig(store, keyFile, mode string) string {
	return fmt.Sprintf(`[store]
%s
timeout = %q
lease_key_file = %q

[[rule]]
name = "once-bucket"
match = { bucket = "1" }
by = ["api_key"]
limit = 1000
period = "100h"
mode = "strict"

[[rule]]
name = "once-window"
match = { window = "1" }
by = ["api_key"]
algorithm = "fixed_window"
limit = 1000
period = "100h"
mode = "strict"

[[rule]]
name = "once-cached"
match = { cached = "1" }
by = ["api_key"]
limit = 1000
period = "100h"
mode = %q

[[rule]]
name = "once-slots"
match = { slots = "1" }
by = ["api_key"]
algorithm = "concurrency"
limit = 1
timeout = "1m"
`, store, fleetTimeout, keyFile, mode)
}

// onceDescs are the descriptors of a request of key that counts under the
// rules of onceConfig named by only, or all of them.
func onceDescs(key string, only ...string) []client.Descriptor {
	if len(only) == 0 {
		only = []string{"bucket", "window", "cached", "slots"}
	}
	d := []client.Descriptor{{Name: "api_key", Value: key}}
	for _, o := range only {
		d = append(d, client.Descriptor{Name: o, Value: "1"})
	}
	return d
}

// TestSettleOnceFleet: three daemons on one Redis share one record of
// the leases settled: a lease settled through one daemon is charged once;
// settled again through each of them (at another actual cost, also after
// a settle at the estimate) it is refused as settled already and changes
// nothing: no unit charged or refunded, no slot freed. Leases settled
// through the three daemons at once are settled by exactly one.
func TestSettleOnceFleet(t *testing.T) {
	srv := redistest.Standalone(t)
	runSettleOnceFleet(t, fmt.Sprintf("redis = [%q]", srv.Addr))
}

// TestSettleOnceFleetCluster: the same on a Cluster, where each record
// lives in its counter's slot.
func TestSettleOnceFleetCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	store := clusterStore(cl)
	runSettleOnceFleet(t, store)
}

func runSettleOnceFleet(t *testing.T, store string) {
	keyFile := filepath.Join(t.TempDir(), "lease.key")
	require.NoError(t, os.WriteFile(keyFile, []byte("a lease key shared by the fleet\n"), 0o600))
	cfg := onceConfig(store, keyFile, "cached")
	fleet := make([]*daemontest.Process, 3)
	clients := make([]*client.Client, len(fleet))
	for i := range fleet {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		fleet[i], clients[i] = p, client.New(p.Socket)
		t.Cleanup(func() { clients[i].Close() })
	}
	ctx := context.Background()
	cases := []struct {
		key           string
		first, second uint32 // the actual costs; the estimate is 3
	}{
		{"sk_once_charge", 10, 20},
		{"sk_once_refund", 1, 20},
		{"sk_once_estimate", 3, 20},
		{"sk_once_estimate_refund", 3, 1},
	}
	for n, tc := range cases {
		a, err := clients[n%3].Acquire(ctx, onceDescs(tc.key), 3)
		require.NoError(t, err)
		require.True(t, a.Allowed(), "%+v", a)
		_, err = clients[n%3].Settle(ctx, a.Lease, tc.first)
		require.NoError(t, err, tc.key)
		// The slot is free again: another request holds it.
		b, err := clients[(n+1)%3].Acquire(ctx, onceDescs(tc.key, "slots"), 1)
		require.NoError(t, err)
		require.True(t, b.Allowed(), "%s: %+v", tc.key, b)
		for i := range clients {
			_, err := clients[i].Settle(ctx, a.Lease, tc.second)
			var re *client.ResponseError
			require.ErrorAs(t, err, &re, "%s: daemon %d", tc.key, i)
			assert.Equal(t, wire.CodeNotFound, re.Code, "%s: daemon %d", tc.key, i)
			assert.Contains(t, re.Message, "settled already", "%s: daemon %d", tc.key, i)
		}
		r, err := clients[(n+2)%3].Acquire(ctx, onceDescs(tc.key, "slots"), 1)
		require.NoError(t, err)
		assert.Equal(t, wire.StatusLimited, r.Status, "%s: the slot is still held", tc.key)
		_, err = clients[0].Release(ctx, b.Lease)
		require.NoError(t, err, tc.key)
	}

	// Leases settled through the three daemons at once, each at its own
	// cost: one settle wins, whole, and the others are refused.
	const racing = 20
	for n := range racing {
		key := fmt.Sprintf("sk_once_race_%d", n)
		a, err := clients[n%3].Acquire(ctx, onceDescs(key), 3)
		require.NoError(t, err)
		require.True(t, a.Allowed(), "%+v", a)
		var wg sync.WaitGroup
		var won atomic.Int64
		errs := make([]error, len(clients))
		for i := range clients {
			wg.Go(func() {
				_, errs[i] = clients[i].Settle(ctx, a.Lease, uint32(10*(i+1)))
				if errs[i] == nil {
					won.Store(int64(10 * (i + 1)))
				}
			})
		}
		wg.Wait()
		ok := 0
		for i, err := range errs {
			if err == nil {
				ok++
				continue
			}
			var re *client.ResponseError
			require.ErrorAs(t, err, &re, "%s: daemon %d", key, i)
			assert.Contains(t, re.Message, "settled already", "%s: daemon %d", key, i)
		}
		require.Equal(t, 1, ok, "%s: one settle wins: %v", key, errs)
		cases = append(cases, struct {
			key           string
			first, second uint32
		}{key, uint32(won.Load()), 0})
	}

	// The cached daemons return their leases when they stop; a strict
	// daemon then reads what each counter was charged.
	for _, p := range fleet {
		require.NoError(t, p.Term(10*time.Second))
	}
	checker := start1(t, onceConfig(store, keyFile, "strict"))
	c := client.New(checker.Socket)
	defer c.Close()
	for _, tc := range cases {
		for _, rule := range []string{"bucket", "window", "cached"} {
			r, err := c.Peek(ctx, onceDescs(tc.key, rule), 1)
			require.NoError(t, err)
			charged := 1000 - int64(r.Remaining) - 1 // the peek counts its unit
			assert.Equal(t, int64(tc.first), charged, "%s: %s: charged the first settle's cost, once", tc.key, rule)
		}
	}
}
