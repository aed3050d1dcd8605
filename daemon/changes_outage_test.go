package daemon_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
)

// TestChangeWhileRedisDown: with Redis unreachable (its calls time out),
// an override or a block made through a daemon's admin API fails within
// the change's 3 s bound, instead of waiting for Redis to come back, and
// says that it may still be stored (a call that timed out may reach
// Redis later); with the connections reset, none is stored once Redis is
// back. A reset or grant that changed no counter fails too, rather than
// answering success with the errors inside.
func TestChangeWhileRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	p, err := daemontest.StartProcess(fleetChangeConfig(proxy.Addr()))
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("daemon log:\n%s", p.Logs())
		}
		p.Close()
	})
	key := admin.Pairs{"api_key": "down"}
	require.Nil(t, changeCall(t, p.Socket, "reset", admin.ResetArgs{Target: admin.Target{Rule: "per-key", Key: key}}, nil), "Redis up: a reset works")

	proxy.Blackhole()
	for _, c := range []struct {
		op   string
		args any
	}{
		{"override-set", admin.OverrideArgs{Rule: "per-key", Key: key, Limit: 5, TTL: "1h"}},
		{"block", admin.BlockArgs{Rule: "per-key", Key: key, TTL: "1h"}},
		{"reset", admin.ResetArgs{Target: admin.Target{Rule: "per-key", Key: key}}},
		{"grant", admin.GrantArgs{Target: admin.Target{Rule: "per-key", Key: key}, N: 3}},
	} {
		start := time.Now()
		// The bound under test: changeCall gives up (and fails the
		// test) after 5 s; a change has 3 s.
		aerr := changeCall(t, p.Socket, c.op, c.args, nil)
		took := time.Since(start)
		if assert.NotNil(t, aerr, "%s answered success with Redis unreachable", c.op) {
			assert.Equal(t, admin.CodeInternal, aerr.Code, "%s: %v", c.op, aerr)
			if c.op == "override-set" {
				assert.Contains(t, aerr.Message, "may still be stored", "its first call timed out")
			}
		}
		t.Logf("%s: failed after %v: %v", c.op, took.Round(time.Millisecond), aerr)
	}

	proxy.Drop() // what was sent and not delivered is lost
	proxy.Heal()
	// Back: the daemon's calls reach Redis again (an admin reset works),
	// and the changes that failed were not stored meanwhile.
	redistest.WaitFor(t, "a reset through the healed proxy", func() bool {
		return changeCall(t, p.Socket, "reset", admin.ResetArgs{Target: admin.Target{Rule: "per-key", Key: key}}, nil) == nil
	})
	n, err := redistest.Do(srv.Addr, "HLEN", changesKey)
	require.NoError(t, err)
	assert.EqualValues(t, "0", n, "no change was stored after its failure")
}
