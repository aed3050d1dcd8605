package daemon_test

import (
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
	srv := redistest.Standalone(t)
	socks, cs := startStateFleet(t, srv, "strict", 3)
	checkResetGrant(t, socks, cs, "strict")
}

// TestResetGrantRedisCached: cached rules of every algorithm on Redis.
// The daemon that runs the op drops its cache entry (its denial, its
// lease): alone on the Redis, it sees a fresh key at once and admits
// exactly the limit after a reset, n after a grant of n. With three
// daemons, a grant of n to a key they all know used up admits exactly n
// more across the fleet: the others deny from what they hold, never
// more. (A reset is not yet exact across a fleet of cached daemons: see
// docs/cache.md.)
func TestResetGrantRedisCached(t *testing.T) {
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
