package daemon_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/client"
	"github.com/rld/rld/config"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// changesKey is the Redis key of the fleet's changes with the default
// key prefix: one hash, in one slot.
const changesKey = "{" + config.DefaultKeyPrefix + "changes}"

// haChangeConfig is rld.toml of a daemon of the changes' Cluster and
// Sentinel tests: store is the [store] lines naming Redis. The version is
// polled once a minute only, so that what reaches the daemons within the
// tests' bounds came by the announcements.
func haChangeConfig(store string) string {
	return fmt.Sprintf(`
[admin]
socket_uids = [%d]
[store]
%s
changes_poll = "1m"
timeout = %q
[[rule]]
name = "per-key"
by = ["api_key"]
limit = 1000000
period = "1h"
`, os.Getuid(), store, fleetTimeout)
}

func startHAFleet(t *testing.T, cfg string, n int) []*daemontest.Process {
	t.Helper()
	var ps []*daemontest.Process
	for range n {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("daemon log:\n%s", p.Logs())
			}
			p.Close()
		})
		ps = append(ps, p)
	}
	return ps
}

// changeRound sets an override and blocks a key through daemon from of
// ps, named by tag, and waits until both are in force on every daemon
// within limit; it returns how long each daemon took.
func changeRound(t *testing.T, ps []*daemontest.Process, cs []*client.Client, from int, tag string, limit time.Duration) []time.Duration {
	t.Helper()
	want := int64(100 + len(tag))
	t0 := time.Now()
	require.Nil(t, changeCall(t, ps[from].Socket, "override-set",
		admin.OverrideArgs{Rule: "per-key", Key: admin.Pairs{"api_key": "o-" + tag}, Limit: want, TTL: "1h"}, nil))
	require.Nil(t, changeCall(t, ps[from].Socket, "block",
		admin.BlockArgs{Rule: "per-key", Key: admin.Pairs{"api_key": "b-" + tag}, TTL: "1h"}, nil))
	seen := untilAll(t, len(ps), limit, func(d int) bool {
		return limitOf(t, ps[d].Socket, "o-"+tag) == want && checkStatus(t, cs[d], "b-"+tag) == wire.StatusBlocked
	})
	var lat []time.Duration
	for _, s := range seen {
		lat = append(lat, s.Sub(t0))
	}
	return lat
}

// listAll lists every page of the daemon at socket.
func listAll(t *testing.T, socket string) admin.ListResult {
	t.Helper()
	var all admin.ListResult
	a := admin.ListArgs{Limit: admin.MaxListLimit}
	for {
		var p admin.ListResult
		require.Nil(t, changeCall(t, socket, "list", a, &p))
		all.Overrides = append(all.Overrides, p.Overrides...)
		all.Blocks = append(all.Blocks, p.Blocks...)
		if p.Next == "" {
			return all
		}
		a.Cursor = p.Next
	}
}

func clients(t *testing.T, ps []*daemontest.Process) []*client.Client {
	cs := make([]*client.Client, len(ps))
	for i, p := range ps {
		cs[i] = client.New(p.Socket)
		t.Cleanup(func() { cs[i].Close() })
	}
	return cs
}

// TestChangesCluster: three daemons on a Redis Cluster (3 primaries, 3
// replicas). Overrides and blocks set through each daemon in turn are in
// force on all three within 2 s — by the announcements, which Cluster
// carries to subscribers on every node, the poll being a minute — and
// the changes' hash sits in one slot. After the primary of that slot is
// killed and its replica promoted, the changes made before are still in
// force and new ones keep reaching every daemon.
func TestChangesCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.AllowPartialCoverage())
	store := clusterStore(cl)
	ps := startHAFleet(t, haChangeConfig(store), 3)
	cs := clients(t, ps)

	var lat []time.Duration
	const rounds = 30
	for i := range rounds {
		lat = append(lat, changeRound(t, ps, cs, i%3, fmt.Sprintf("c%d", i), 2*time.Second)...)
	}
	p50, p99, mx := percentiles(lat)
	t.Logf("cluster: override and block in force on all three daemons: %d rounds × 3 daemons: p50 %s, p99 %s, max %s",
		rounds, p50, p99, mx)
	assert.Less(t, p99, 2*time.Second)

	// One hash, on the primary of its slot: every entry and the version.
	primary := cl.PrimaryFor(changesKey)
	n, err := redistest.Do(primary.Addr, "HLEN", changesKey)
	require.NoError(t, err)
	assert.Equal(t, fmt.Sprint(2*rounds+2), n, "every override and block, the version and the epoch, in the one hash")

	// Failover of that slot: the replica had every entry (wait for it).
	redistest.WaitFor(t, "the replica has the changes", func() bool {
		acked, err := redistest.Do(primary.Addr, "WAIT", "1", "1000")
		return err == nil && acked == "1"
	})
	killed := time.Now()
	primary.Kill()
	cl.WaitFailover(t, primary)
	t.Logf("cluster failover took %s", time.Since(killed).Round(time.Millisecond))
	for d := range ps {
		assert.Equal(t, int64(100+len("c0")), limitOf(t, ps[d].Socket, "o-c0"), "daemon %d: the changes made before the failover", d)
	}
	// The first change after the failover may wait for the daemons to
	// subscribe again (their backoff); the later ones are as before.
	first := changeRound(t, ps, cs, 0, "after0", 10*time.Second)
	t.Logf("cluster: first change after the failover in force on all three after %v", first)
	lat = lat[:0]
	for i := 1; i < 10; i++ {
		lat = append(lat, changeRound(t, ps, cs, i%3, fmt.Sprintf("after%d", i), 2*time.Second)...)
	}
	p50, p99, mx = percentiles(lat)
	t.Logf("cluster, after the failover: p50 %s, p99 %s, max %s", p50, p99, mx)

	// A daemon started now loads the whole set.
	late := startHAFleet(t, haChangeConfig(store), 1)[0]
	list := listAll(t, late.Socket)
	assert.Len(t, list.Overrides, rounds+10)
	assert.Len(t, list.Blocks, rounds+10)
}

// TestChangesSentinel: three daemons on a Sentinel primary and replica.
// Changes reach every daemon by the announcements (the poll being a
// minute). After the primary is killed and the replica promoted, the
// daemons follow it: they still apply the set made before, apply new
// changes made through any of them — an unblock too — and a daemon that
// starts loads the current set.
func TestChangesSentinel(t *testing.T) {
	t.Parallel()
	g := redistest.StartSentinel(t)
	addrs := quotedList(g.SentinelAddrs())
	cfg := haChangeConfig(fmt.Sprintf("redis = [%s]\nmode = \"sentinel\"\nmaster_set = %q", addrs, g.MasterSet))
	ps := startHAFleet(t, cfg, 3)
	cs := clients(t, ps)

	var lat []time.Duration
	const rounds = 10
	for i := range rounds {
		lat = append(lat, changeRound(t, ps, cs, i%3, fmt.Sprintf("s%d", i), 2*time.Second)...)
	}
	p50, p99, mx := percentiles(lat)
	t.Logf("sentinel: override and block in force on all three daemons: %d rounds × 3 daemons: p50 %s, p99 %s, max %s",
		rounds, p50, p99, mx)
	var blk admin.BlockEntry
	require.Nil(t, changeCall(t, ps[0].Socket, "block", admin.BlockArgs{Match: admin.Pairs{"api_key": "lift-*"}, TTL: "1h"}, &blk))
	untilAll(t, 3, 2*time.Second, func(d int) bool { return checkStatus(t, cs[d], "lift-1") == wire.StatusBlocked })

	redistest.WaitFor(t, "the replica has the changes", func() bool {
		n, err := redistest.Do(g.Replica().Addr, "HLEN", changesKey)
		return err == nil && n == fmt.Sprint(2*rounds+3) // with the version and the epoch
	})
	killed := time.Now()
	g.Primary().Kill()
	g.WaitFailover(t)
	t.Logf("sentinel failover took %s", time.Since(killed).Round(time.Millisecond))

	// New changes after the failover, through each daemon; the first may
	// wait for the daemons to find the new primary and subscribe again.
	first := changeRound(t, ps, cs, 1, "after0", 10*time.Second)
	t.Logf("sentinel: first change after the failover in force on all three after %v", first)
	lat = lat[:0]
	for i := 1; i < 10; i++ {
		lat = append(lat, changeRound(t, ps, cs, i%3, fmt.Sprintf("after%d", i), 2*time.Second)...)
	}
	p50, p99, mx = percentiles(lat)
	t.Logf("sentinel, after the failover: p50 %s, p99 %s, max %s", p50, p99, mx)
	for d := range ps {
		assert.Equal(t, int64(100+len("s0")), limitOf(t, ps[d].Socket, "o-s0"), "daemon %d: the changes made before the failover", d)
		assert.Equal(t, wire.StatusBlocked, checkStatus(t, cs[d], "b-s0"), "daemon %d", d)
	}
	require.Nil(t, changeCall(t, ps[2].Socket, "unblock", admin.IDArgs{ID: blk.ID}, nil))
	untilAll(t, 3, 2*time.Second, func(d int) bool { return checkStatus(t, cs[d], "lift-1") == wire.StatusAllowed })

	late := startHAFleet(t, cfg, 1)[0]
	list := listAll(t, late.Socket)
	assert.Len(t, list.Overrides, rounds+10, "a daemon that starts loads the current set")
	assert.Len(t, list.Blocks, rounds+10)
}
