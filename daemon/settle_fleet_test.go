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
	t.Parallel()
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
	t.Parallel()
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

// refundConfig: one cached token bucket of 100 an hour by api_key (a
// unit refills every 36 s), in mode.
func refundConfig(store, keyFile, mode string) string {
	return fmt.Sprintf(`[store]
%s
timeout = %q
lease_key_file = %q

[[rule]]
name = "refund"
by = ["api_key"]
limit = 100
period = "1h"
mode = %q
`, store, fleetTimeout, keyFile, mode)
}

// refundUsableBound is how soon after a settle's answer its refund must
// be usable on every daemon: generous (a daemon takes it as the
// announcement comes in, within milliseconds), and far below what a
// hammered key's denial from before the refund lasts (36 s and more).
const refundUsableBound = 2 * time.Second

// TestSettleRefundUsableEverywhere: four daemons on one Redis. Daemon 0
// acquires a key's whole limit (100 of 100 an hour); daemon 1 answers a
// denial of it; daemons 2 and 3 peek it every 2 ms (so that they deny it
// locally for the store's retry-after). A settle at 1 through daemon 0
// refunds 99: a check of 99 is then admitted promptly on each daemon in
// turn (a key per round), and no denial any daemon gives meanwhile
// carries a Retry-After above what the store said for the cost.
func TestSettleRefundUsableEverywhere(t *testing.T) {
	srv := redistest.Standalone(t)
	store := fmt.Sprintf("redis = [%q]", srv.Addr)
	keyFile := filepath.Join(t.TempDir(), "lease.key")
	require.NoError(t, os.WriteFile(keyFile, []byte("a lease key shared by the fleet\n"), 0o600))
	cfg := refundConfig(store, keyFile, "cached")
	const daemons = 4
	clients := make([]*client.Client, daemons)
	for i := range clients {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		clients[i] = client.New(p.Socket)
		t.Cleanup(func() { clients[i].Close() })
	}
	// Every daemon listens to the recalls' channel (refunds go there).
	redistest.WaitFor(t, "the daemons to subscribe to the recalls", func() bool {
		out, err := redistest.Do(srv.Addr, "PUBSUB", "NUMSUB", "rld:recall")
		return err == nil && out == fmt.Sprintf("rld:recall\n%d", daemons)
	})
	// A strict daemon on the same rule reads the store's own answer.
	checker := start1(t, refundConfig(store, keyFile, "strict"))
	storeClient := client.New(checker.Socket)
	t.Cleanup(func() { storeClient.Close() })
	ctx := context.Background()

	for target := range daemons {
		descs := []client.Descriptor{{Name: "api_key", Value: fmt.Sprintf("sk_refund_%d", target)}}
		a, err := clients[0].Acquire(ctx, descs, 100)
		require.NoError(t, err)
		require.True(t, a.Allowed(), "%+v", a)
		r, err := clients[1].Check(ctx, descs, 1)
		require.NoError(t, err)
		require.Equal(t, wire.StatusLimited, r.Status, "daemon 1 answers a denial")

		// Daemons 2 and 3 peek the key every 2 ms until the round ends.
		var peekDenials [daemons]atomic.Int64
		var peekErr atomic.Pointer[error]
		pctx, stopPeeks := context.WithCancel(ctx)
		var peekers sync.WaitGroup
		for i := 2; i < daemons; i++ {
			peekers.Go(func() {
				tick := time.NewTicker(2 * time.Millisecond)
				defer tick.Stop()
				for {
					r, err := clients[i].Peek(pctx, descs, 1)
					switch {
					case pctx.Err() != nil:
						return
					case err != nil:
						peekErr.Store(&err)
						return
					case r.Status == wire.StatusLimited:
						peekDenials[i].Add(1)
					}
					select {
					case <-pctx.Done():
						return
					case <-tick.C:
					}
				}
			})
		}
		redistest.WaitFor(t, "the peekers to be denied", func() bool {
			return peekDenials[2].Load() >= 20 && peekDenials[3].Load() >= 20
		})

		// What the store says of a check of 99 before the refund.
		sr, err := storeClient.Peek(ctx, descs, 99)
		require.NoError(t, err)
		require.Equal(t, wire.StatusLimited, sr.Status)
		storeRetry := sr.RetryAfter

		_, err = clients[0].Settle(ctx, a.Lease, 1)
		require.NoError(t, err)
		settled := time.Now()
		var denials int
		var maxRetry time.Duration
		for {
			r, err := clients[target].Check(ctx, descs, 99)
			require.NoError(t, err)
			if r.Allowed() {
				break
			}
			denials++
			maxRetry = max(maxRetry, r.RetryAfter)
			assert.LessOrEqual(t, r.RetryAfter, storeRetry, "daemon %d: a Retry-After above the store's", target)
			require.Less(t, time.Since(settled), refundUsableBound, "daemon %d: the refund not usable (last: %+v)", target, r)
			time.Sleep(time.Millisecond) // polling for the refund to reach it
		}
		took := time.Since(settled)
		stopPeeks()
		peekers.Wait()
		if p := peekErr.Load(); p != nil {
			t.Fatalf("peek: %v", *p)
		}
		// The 99 are taken: the store has nothing left.
		sr, err = storeClient.Peek(ctx, descs, 1)
		require.NoError(t, err)
		assert.Equal(t, wire.StatusLimited, sr.Status, "daemon %d: 99 taken once", target)
		t.Logf("daemon %d: a check of 99 admitted %v after the settle's answer (%d denials meanwhile, longest Retry-After %v; the store's before the refund %v)",
			target, took.Round(10*time.Microsecond), denials, maxRetry, storeRetry.Round(time.Second))
	}
}
