package daemon_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/region"
	"github.com/rld/rld/wire"
)

// exactPeriod is the period of the rules whose checks must admit
// exactly the limit: no refill and no window's end falls within a test
// (with the fleet's 500 ms, 8 checks on a loaded host sometimes spanned
// a fixed window's end, and a sixth was rightly admitted).
const exactPeriod = time.Hour

// TestRedisOverTLS: a daemon whose [store] names a Redis that takes
// only TLS clients with a password, with tls = true and the CA that
// signed its certificate, decides every algorithm there, cached and
// strict, and admits each key's limit exactly; one that trusts another
// CA does not start, and says why.
func TestRedisOverTLS(t *testing.T) {
	t.Parallel()
	srv, tlsPort := redistest.StandaloneTLS(t)
	_, err := redistest.Do(srv.Addr, "CONFIG", "SET", "requirepass", "s3cret")
	require.NoError(t, err)
	store := func(caFile string) string {
		return fmt.Sprintf("redis = [%q]\npassword = \"s3cret\"\ntls = true\ntls_ca_file = %q", tlsPort.Addr, caFile)
	}

	_, err = daemontest.Start(fleetConfig(store(redistest.CAFile(t)), 5, "cached"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot use store.redis")
	assert.Contains(t, err.Error(), "certificate signed by unknown authority")

	admitsExactly(t, store(tlsPort.CAFile), 1)
	// The counters are in that Redis (read on its plain port).
	rc, err := region.Dial(region.DialOptions{Addrs: []string{srv.Addr}, Password: "s3cret"})
	require.NoError(t, err)
	defer rc.Close()
	n, err := rc.Do(context.Background(), rc.B().Dbsize().Build()).AsInt64()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, int64(len(fleetKinds)), "counters in the Redis reached over TLS")
}

// TestRedisClusterOverTLS: a daemon whose [store] names the TLS ports of
// a Cluster (bus and replication over TLS too, whose CLUSTER SHARDS
// names each node's plain port beside its TLS port) decides every
// algorithm there, cached and strict, and admits each key's limit
// exactly; its counters are spread over the three primaries.
func TestRedisClusterOverTLS(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.ClusterTLS())
	store := fmt.Sprintf("redis = [%s]\nmode = \"cluster\"\ntls = true\ntls_ca_file = %q", quotedList(cl.TLSAddrs()), cl.CAFile)
	admitsExactly(t, store, 3)
	// The counters are on the primaries (read on their plain ports).
	spread := 0
	for _, p := range cl.Primaries() {
		n, err := redistest.Do(p.Addr, "DBSIZE")
		require.NoError(t, err)
		if n != "0" {
			spread++
		}
	}
	assert.Equal(t, 3, spread, "primaries holding counters")
}

// TestRedisSentinelOverTLS: a daemon whose [store] names sentinels that
// serve TLS, monitoring a primary and a replica that replicate over TLS,
// decides every algorithm on the primary, cached and strict, and admits
// each key's limit exactly; after a failover, on the promoted replica.
func TestRedisSentinelOverTLS(t *testing.T) {
	t.Parallel()
	g := redistest.StartSentinel(t, redistest.SentinelTLS())
	store := fmt.Sprintf("redis = [%s]\nmode = \"sentinel\"\nmaster_set = %q\ntls = true\ntls_ca_file = %q",
		quotedList(g.SentinelAddrs()), g.MasterSet, g.CAFile)
	admitsExactly(t, store, 1)
	// The counters are on the primary (read on its plain port).
	n, err := redistest.Do(g.Primary().Addr, "DBSIZE")
	require.NoError(t, err)
	assert.NotEqual(t, "0", n, "counters on the primary")

	// The primary killed, the sentinels report the promoted replica's
	// TLS port (it announced it, replicating over TLS), and the daemon
	// decides there: a fresh key admits exactly its limit again (its
	// rule's fail mode, while no primary answered, would not).
	d, err := daemontest.Start(fleetConfigPeriod(store, 5, "strict", exactPeriod))
	require.NoError(t, err)
	defer d.Close()
	c := client.New(d.Socket)
	defer c.Close()
	g.Primary().Kill()
	promoted := g.WaitFailover(t)
	attempt := 0
	redistest.WaitFor(t, "a fresh key decided on the promoted primary "+promoted.TLSAddr, func() bool {
		attempt++
		n, err := admitted(c, fmt.Sprintf("after-%d", attempt), "token_bucket")
		return err == nil && n == 5
	})
}

// admitsExactly starts a daemon on store with the fleet's rules of a
// limit of 5 an hour, cached then strict, and asserts that 8 checks of
// each of keys keys of every algorithm admit exactly 5.
func admitsExactly(t *testing.T, store string, keys int) {
	t.Helper()
	for _, mode := range []string{"cached", "strict"} {
		d, err := daemontest.Start(fleetConfigPeriod(store, 5, mode, exactPeriod))
		require.NoError(t, err, mode)
		c := client.New(d.Socket)
		for _, k := range fleetKinds {
			for key := range keys {
				n, err := admitted(c, fmt.Sprintf("tls-%s-%s-%d", mode, k, key), k.String())
				require.NoError(t, err)
				assert.Equal(t, 5, n, "%s, %s: 8 checks of a limit of 5", mode, k)
			}
		}
		c.Close()
		d.Close()
	}
}

// admitted returns how many of 8 checks of api_key key with alg = alg c
// got allowed, and the first error of a check.
func admitted(c *client.Client, key, alg string) (int, error) {
	n := 0
	var first error
	for range 8 {
		r, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: key}, {Name: "alg", Value: alg}}, 1)
		if err == nil && r.Status == wire.StatusAllowed {
			n++
		}
		if first == nil {
			first = err
		}
	}
	return n, first
}
