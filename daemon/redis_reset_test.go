package daemon_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
)

// startStateFleet starts three daemon processes of mode on one Redis and
// returns their sockets and a client of each.
func startStateFleet(t *testing.T, srv *redistest.Server, mode string) ([]string, []*client.Client) {
	cfg := stateConfig(fmt.Sprintf("redis = [%q]\nsync_interval = \"100ms\"", srv.Addr), mode)
	var socks []string
	var cs []*client.Client
	for range 3 {
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
	socks, cs := startStateFleet(t, srv, "strict")
	checkResetGrant(t, socks, cs, "strict")
}
