package daemon_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// startStateFleet starts n daemon processes of mode on one Redis and
// returns their sockets and a client of each.
func startStateFleet(t *testing.T, srv *redistest.Server, mode string, n int) ([]string, []*client.Client) {
	cfg := stateConfig(fmt.Sprintf("redis = [%q]\nsync_interval = \"100ms\"", srv.Addr), mode)
	var socks []string
	var cs []*client.Client
	for range n {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		c := client.New(p.Socket)
		t.Cleanup(func() { c.Close() })
		socks, cs = append(socks, p.Socket), append(cs, c)
	}
	return socks, cs
}

// TestResetGrantRedisStrict: three daemons on one Redis, strict rules of
// every algorithm: a key used up through all three and reset through
// one is fresh on each, and the fleet admits exactly the limit after
// the reset, and exactly n after a grant of n.
func TestResetGrantRedisStrict(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	socks, cs := startStateFleet(t, srv, "strict", 3)
	checkResetGrant(t, socks, cs, "strict")
}

// TestResetGrantRedisCached: cached rules of every algorithm on Redis.
// The daemon that runs the op drops its cache entry (its denial, its
// view; its lease goes back): alone on the Redis, it sees a fresh key at
// once and admits exactly the limit after a reset, n after a grant of n.
// With three daemons, a grant of n to a key they all know used up admits
// exactly n more across the fleet: the others deny from what they hold,
// never more. (TestResetFleetExact: a reset across the fleet.)
func TestResetGrantRedisCached(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	socks, cs := startStateFleet(t, srv, "cached", 1)
	checkResetGrant(t, socks, cs, "cached")

	socks, cs = startStateFleet(t, srv, "cached", 3)
	for _, k := range fleetKinds {
		if k == algo.SlidingLog {
			continue
		}
		t.Run("fleet/"+k.String(), func(t *testing.T) {
			key := fmt.Sprintf("grant-%s-%d", k, time.Now().UnixNano())
			descs := stateDescs(k, key)
			useUp(t, cs, descs)
			const n = 3
			_, aerr := adminCall(t, socks[0], "grant", admin.GrantArgs{Target: admin.Target{Rule: k.String(), Key: admin.Pairs{"api_key": key}}, N: n})
			require.Nil(t, aerr)
			assert.Equal(t, int64(n), hammerAll(t, cs, descs, 10*n))
		})
	}
}

// TestResetFleetExact: three daemons on one Redis, every algorithm in
// both modes. Before the reset, each daemon checks a key twice (6 of the
// limit of 10 per hour: the cached daemons then hold leases of it), or
// four times (12: the key is used up, and the cached daemons hold
// denials). A reset through the first daemon then makes it a fresh key
// everywhere: each daemon's next check is admitted once the reset's
// announcement has reached it (measured), and the fleet admits exactly
// the limit after the reset (drained round-robin), never more: the
// units still out on lease at the reset were left out of the fresh
// state, and the holders' returns gave them back.
func TestResetFleetExact(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	for _, mode := range []string{"cached", "strict"} {
		socks, cs := startStateFleet(t, srv, mode, 3)
		for _, k := range fleetKinds {
			if mode == "cached" && k == algo.SlidingLog {
				continue // strict only
			}
			for _, warm := range []int{2, 4} {
				t.Run(fmt.Sprintf("%s/%s/%d", mode, k, warm), func(t *testing.T) {
					checkResetExact(t, srv, socks, cs, k, fmt.Sprintf("exact-%s-%s-%d-%d", mode, k, warm, time.Now().UnixNano()), warm, mode == "cached" && warm == 2)
				})
			}
		}
	}
}

// drain checks descs through each client in turn, as a client within its
// limit would (a key hammered far over its limit recalls nothing: see
// docs/cache.md), until a whole round is refused, and returns how many
// checks were admitted.
func drain(t *testing.T, cs []*client.Client, descs []client.Descriptor) int64 {
	t.Helper()
	var admitted int64
	for range 100 {
		refused := 0
		for _, c := range cs {
			r, err := c.Check(context.Background(), descs, 1)
			require.NoError(t, err)
			if r.Allowed() {
				admitted++
			} else {
				refused++
			}
		}
		if refused == len(cs) {
			return admitted
		}
	}
	t.Fatal("the key was never used up")
	return 0
}

// checkResetExact checks key warm times through each client, resets it
// through socks[0], and checks that each client's next checks are
// admitted and that the fleet then admits exactly the limit. With leased
// set, some daemon must hold units out on lease at the reset.
func checkResetExact(t *testing.T, srv *redistest.Server, socks []string, cs []*client.Client, k algo.Kind, key string, warm int, leased bool) {
	descs := stateDescs(k, key)
	var before int64
	for range warm {
		for _, c := range cs {
			r, err := c.Check(context.Background(), descs, 1)
			require.NoError(t, err)
			if r.Allowed() {
				before++
			}
		}
	}
	outKey := string(redisx.AppendKey(nil, "rld:", counterKey(k.String(), key), k)) + ":out"
	out, err := redistest.Do(srv.Addr, "HGETALL", outKey)
	require.NoError(t, err)
	t.Logf("before the reset: %d of %d admitted; units out on lease: %q", before, warm*len(cs), out)
	if leased {
		require.NotEmpty(t, out, "no daemon holds a lease at the reset")
	}

	_, aerr := adminCall(t, socks[0], "reset", admin.ResetArgs{Target: admin.Target{Rule: k.String(), Key: admin.Pairs{"api_key": key}}})
	require.Nil(t, aerr)
	reset := time.Now()
	out, err = redistest.Do(srv.Addr, "HGETALL", outKey)
	require.NoError(t, err)
	t.Logf("right after the reset: units out on lease: %q", out)
	var after int64
	for i, c := range cs {
		for {
			r, err := c.Check(context.Background(), descs, 1)
			require.NoError(t, err)
			if r.Allowed() {
				after++
				break
			}
			require.Less(t, time.Since(reset), 2*time.Second, "daemon %d: still refused after the reset", i)
		}
		t.Logf("daemon %d: a fresh key %v after the reset", i, time.Since(reset).Round(time.Microsecond))
	}
	after += drain(t, cs, descs)
	out, err = redistest.Do(srv.Addr, "HGETALL", outKey)
	require.NoError(t, err)
	t.Logf("after: %d admitted; units out on lease: %q", after, out)
	assert.Equal(t, int64(stateLimit), after, "admitted after the reset")
}
