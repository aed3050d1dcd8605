package daemon_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// The concurrency fleet: slotsLimit slots per key, held for at most
// slotsTimeout when not released.
const (
	slotsLimit   = 10
	slotsTimeout = 2 * time.Second
	// slotsCallers callers hold slots for random durations.
	slotsCallers = 200
	// slotsHolds is how many holds each caller makes.
	slotsHolds = 5
)

// slotsConfig is the fleet's configuration on store, its leases signed
// with the key in keyFile, shared by the fleet.
func slotsConfig(store, keyFile string) string {
	return fmt.Sprintf(`[server]
max_connections = 1000

[store]
%s
timeout = %q
lease_key_file = %q

[[rule]]
name = "slots"
by = ["api_key"]
algorithm = "concurrency"
limit = %d
timeout = %q
`, store, fleetTimeout, keyFile, slotsLimit, slotsTimeout)
}

// leaseKeyFile writes a fleet's lease key to a file of t's and returns
// its path.
func leaseKeyFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "lease.key")
	require.NoError(t, os.WriteFile(f, []byte("the concurrency fleet's lease key\n"), 0o600))
	return f
}

// TestConcurrencyFleetStandalone: three daemons on one Redis.
func TestConcurrencyFleetStandalone(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	runConcurrencyFleet(t, fmt.Sprintf("redis = [%q]", srv.Addr))
}

// TestConcurrencyFleetCluster: three daemons on a Redis Cluster.
func TestConcurrencyFleetCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	// A Cluster node named as a standalone server is refused.
	_, err := daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]", cl.Addrs()[0]), 10, "strict"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `cannot use store.redis: store.mode = "standalone", but the Redis at `+cl.Addrs()[0]+` reports redis_mode cluster`)
	store := clusterStore(cl)
	runConcurrencyFleet(t, store)
}

// runConcurrencyFleet starts three daemon processes on store and shows:
//
//   - 200 callers, round-robin over the daemons, hold slots for random
//     durations: the number in flight, counted by the callers between an
//     allowed acquire and its release, never exceeds the limit, and every
//     release finds its slot;
//   - a lease taken on one daemon is released through another;
//   - a caller process SIGKILLed while holding every slot: the capacity
//     comes back within the timeout, not before it;
//   - a daemon SIGKILLed while its callers hold every slot: the same.
func runConcurrencyFleet(t *testing.T, store string) {
	cfg := slotsConfig(store, leaseKeyFile(t))
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
	key := func(v string) []client.Descriptor { return []client.Descriptor{{Name: "api_key", Value: v}} }

	// 200 callers hold slots of one key.
	var inFlight, maxInFlight, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Minute)
	for i := range slotsCallers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 17))
			for held := 0; held < slotsHolds; {
				if time.Now().After(deadline) {
					t.Errorf("caller %d: %d holds after 2 minutes", i, held)
					return
				}
				c := clients[(i+held)%len(clients)]
				r, err := c.Acquire(ctx, key("sk_fleet"), 1)
				if err != nil {
					t.Errorf("caller %d: acquire: %v", i, err)
					return
				}
				if !r.Allowed() {
					refused.Add(1)
					// Pacing the retries: a refused caller comes back
					// later, as a real one does.
					time.Sleep(time.Duration(1+rng.IntN(3)) * time.Millisecond)
					continue
				}
				n := inFlight.Add(1)
				for m := maxInFlight.Load(); n > m && !maxInFlight.CompareAndSwap(m, n); m = maxInFlight.Load() {
				}
				admitted.Add(1)
				time.Sleep(time.Duration(rng.IntN(4000)) * time.Microsecond) // the request's work
				inFlight.Add(-1)
				// Released through the next daemon: a lease is the fleet's.
				if _, err := clients[(i+held+1)%len(clients)].Release(ctx, r.Lease); err != nil {
					t.Errorf("caller %d: release: %v", i, err)
					return
				}
				held++
			}
		})
	}
	wg.Wait()
	t.Logf("%d holds, %d refusals, at most %d in flight", admitted.Load(), refused.Load(), maxInFlight.Load())
	require.LessOrEqual(t, maxInFlight.Load(), int64(slotsLimit), "in flight beyond the limit")
	require.Equal(t, int64(slotsCallers*slotsHolds), admitted.Load())
	require.Positive(t, refused.Load(), "200 callers never met the limit of %d", slotsLimit)

	// Every slot came back: the whole limit fits at once.
	var all []string
	for range slotsLimit {
		r, err := clients[0].Acquire(ctx, key("sk_fleet"), 1)
		require.NoError(t, err)
		require.True(t, r.Allowed(), "%+v", r)
		all = append(all, r.Lease)
	}
	for _, l := range all {
		_, err := clients[2].Release(ctx, l)
		require.NoError(t, err)
	}

	// A caller process holding every slot is SIGKILLed: its slots stay
	// held until their timeout, then come back.
	holder := exec.Command(os.Args[0], "-test.run=^TestConcurrencyHolder$", "-test.v")
	holder.Env = append(os.Environ(), "RLD_TEST_HOLDER="+fleet[0].Socket+"|sk_caller|"+strconv.Itoa(slotsLimit))
	out, err := holder.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	held := waitLine(t, out, "held ")
	heldAt := time.Now()
	r, err := clients[1].Acquire(ctx, key("sk_caller"), 1)
	require.NoError(t, err)
	require.Equal(t, wire.StatusLimited, r.Status, "the holder's slots: %s", held)
	require.NoError(t, holder.Process.Kill())
	_ = holder.Wait()
	back := waitFree(t, clients[2], key("sk_caller"), heldAt)
	t.Logf("a killed caller's slots came back %v after it took them", back)
	assert.LessOrEqual(t, back, slotsTimeout+time.Second, "capacity back within the timeout")
	assert.GreaterOrEqual(t, back, slotsTimeout-500*time.Millisecond, "slots not released are held until their timeout")

	// A daemon is SIGKILLed while its callers hold every slot: the callers
	// cannot release through it; the slots expire at their timeout.
	var leases []string
	for range slotsLimit {
		r, err := clients[0].Acquire(ctx, key("sk_daemon"), 1)
		require.NoError(t, err)
		require.True(t, r.Allowed(), "%+v", r)
		leases = append(leases, r.Lease)
	}
	takenAt := time.Now()
	fleet[0].Kill()
	_, err = clients[0].Release(ctx, leases[0])
	require.Error(t, err, "its daemon is gone")
	r, err = clients[1].Acquire(ctx, key("sk_daemon"), 1)
	require.NoError(t, err)
	require.Equal(t, wire.StatusLimited, r.Status)
	back = waitFree(t, clients[1], key("sk_daemon"), takenAt)
	t.Logf("the slots held through a killed daemon came back %v after they were taken", back)
	assert.LessOrEqual(t, back, slotsTimeout+time.Second, "capacity back within the timeout")
	// The first lease taken is the first to expire, which freed the slot
	// waitFree saw (on a loaded host the later ones may still hold).
	_, err = clients[2].Release(ctx, leases[0])
	var re *client.ResponseError
	require.ErrorAs(t, err, &re, "an expired lease is unknown")
	assert.Equal(t, wire.CodeNotFound, re.Code)
}

// waitLine reads lines from r until one starts with prefix, and returns it.
func waitLine(t *testing.T, r interface{ Read([]byte) (int, error) }, prefix string) string {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			return sc.Text()
		}
	}
	t.Fatalf("no %q line: %v", prefix, sc.Err())
	return ""
}

// waitFree polls an acquire of descs through c until one is allowed
// (and releases it), and returns how long after since that was.
func waitFree(t *testing.T, c *client.Client, descs []client.Descriptor, since time.Time) time.Duration {
	t.Helper()
	deadline := time.Now().Add(slotsTimeout + 10*time.Second)
	for {
		r, err := c.Acquire(context.Background(), descs, 1)
		require.NoError(t, err)
		if r.Allowed() {
			back := time.Since(since)
			_, err := c.Release(context.Background(), r.Lease)
			require.NoError(t, err)
			return back
		}
		require.True(t, time.Now().Before(deadline), "no slot free %v after they were taken", time.Since(since))
		time.Sleep(20 * time.Millisecond) // polling for the expiry
	}
}

// TestConcurrencyHolder is the caller process that runConcurrencyFleet
// SIGKILLs: with RLD_TEST_HOLDER=socket|api_key|n it acquires n slots
// (one per acquire), prints "held" and waits to be killed. Otherwise it
// is skipped.
func TestConcurrencyHolder(t *testing.T) {
	spec := os.Getenv("RLD_TEST_HOLDER")
	if spec == "" {
		t.Skip("the caller process of the concurrency fleet test")
	}
	parts := strings.Split(spec, "|")
	require.Len(t, parts, 3)
	n, err := strconv.Atoi(parts[2])
	require.NoError(t, err)
	c := client.New(parts[0])
	for range n {
		r, err := c.Acquire(context.Background(), []client.Descriptor{{Name: "api_key", Value: parts[1]}}, 1)
		require.NoError(t, err)
		require.True(t, r.Allowed(), "%+v", r)
	}
	fmt.Printf("held %d slots\n", n)
	select {} // until SIGKILL
}

// TestConcurrencyOutage: three daemons on one Redis, which is paused:
// a fail-open concurrency rule holds slots on each daemon's local state at
// its fair share (limit ÷ daemons), answered allowed-degraded, and a
// release of such a slot frees it there.
func TestConcurrencyOutage(t *testing.T) {
	srv := redistest.Standalone(t)
	cfg := fmt.Sprintf(`[store]
redis = [%q]
timeout = "20ms"

[[rule]]
name = "slots"
by = ["api_key"]
algorithm = "concurrency"
limit = 6
timeout = "1m"
fail = "open"
`, srv.Addr)
	var procs []*daemontest.Process
	for range 3 {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		procs = append(procs, p)
	}
	for i, p := range procs {
		redistest.WaitFor(t, fmt.Sprintf("daemon %d to count 3 live daemons", i), func() bool {
			return strings.Contains(p.Logs(), "daemons=3")
		})
	}
	c := client.New(procs[0].Socket)
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	key := []client.Descriptor{{Name: "api_key", Value: "sk_outage"}}

	srv.Pause()
	t.Cleanup(srv.Resume)
	var leases []string
	for range 2 {
		r, err := c.Acquire(ctx, key, 1)
		require.NoError(t, err)
		require.Equal(t, wire.StatusAllowedDegraded, r.Status, "%+v", r)
		assert.True(t, r.Degraded)
		leases = append(leases, r.Lease)
	}
	r, err := c.Acquire(ctx, key, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusLimited, r.Status, "the fair share is 6 ÷ 3 = 2: %+v", r)
	assert.True(t, r.Degraded)
	rel, err := c.Release(ctx, leases[0])
	require.NoError(t, err, "a slot of the local state is released there")
	assert.True(t, rel.Degraded)
	r, err = c.Acquire(ctx, key, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusAllowedDegraded, r.Status, "%+v", r)
}
