package redisx

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/breaker"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx/keyslot"
)

// TestSlotMap checks keyslot.Of against CLUSTER KEYSLOT and the slot map
// against the cluster's own view, through CLUSTER SHARDS and CLUSTER
// SLOTS, and after a failover.
func TestSlotMap(t *testing.T) {
	c := redistest.StartCluster(t, redistest.AllowPartialCoverage())
	ctx := context.Background()
	for _, key := range []string{"foo", "{user1000}.following", "{}", "{}{a}", "a{b}c{d}", "}{x}", "\xff\x00",
		string(AppendKey(nil, "rld:", []byte("api_key=abc|endpoint=/x"), algo.GCRA))} {
		got, err := redistest.Do(c.Addrs()[0], "CLUSTER", "KEYSLOT", key)
		require.NoError(t, err)
		assert.Equal(t, got, fmt.Sprint(keyslot.Of(key)), "CLUSTER KEYSLOT %q", key)
	}

	o, err := Options{Addrs: c.Addrs()[:1], Mode: Cluster, DialTimeout: time.Second}.withDefaults()
	require.NoError(t, err)
	rc, err := rueidis.NewClient(o.rueidisOption())
	require.NoError(t, err)
	t.Cleanup(rc.Close)

	var m slotMap
	assert.Equal(t, "", m.node(0), "before the first refresh")
	require.NoError(t, m.refresh(ctx, rc))
	checkSlotMap(t, &m, c, rc)

	// CLUSTER SLOTS, for Redis before 7, gives the same map.
	for addr, node := range rc.Nodes() {
		reply, err := node.Do(ctx, node.B().ClusterSlots().Build()).ToArray()
		require.NoError(t, err)
		tab, err := parseSlots(reply, addr)
		require.NoError(t, err)
		var fromSlots slotMap
		fromSlots.t.Store(tab)
		for s := range uint16(keyslot.Count) {
			require.Equal(t, m.node(s), fromSlots.node(s), "slot %d from CLUSTER SLOTS of %s", s, addr)
		}
	}

	// After a failover, refresh names the promoted replica.
	const key = "{tenant-1}:tb"
	killed := c.PrimaryFor(key)
	require.Equal(t, killed.Addr, m.node(keyslot.Of(key)))
	killed.Kill()
	promoted := c.WaitFailover(t, killed)
	var lastErr error
	redistest.WaitFor(t, "refresh to name the promoted replica", func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		lastErr = m.refresh(cctx, rc) // some tries ask the killed node first, and fail over to another
		return lastErr == nil && m.node(keyslot.Of(key)) == promoted.Addr
	})
	checkSlotMap(t, &m, c, nil) // rueidis learns of the promotion lazily

	// A refresh that reaches no node fails and keeps the map.
	dead, err := Options{Addrs: []string{killed.Addr}}.withDefaults()
	require.NoError(t, err)
	dc, _ := rueidis.NewClient(dead.rueidisOption()) // a client even when the dial fails
	require.NotNil(t, dc)
	defer dc.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err = m.refresh(cctx, dc)
	assert.ErrorContains(t, err, "redisx: refresh slot map: "+killed.Addr)
	assert.Equal(t, promoted.Addr, m.node(keyslot.Of(key)))
}

// checkSlotMap requires every slot of m to be the cluster's view, and,
// when rc is not nil, every node m names to be one of rc's.
func checkSlotMap(t *testing.T, m *slotMap, c *redistest.Cluster, rc rueidis.Client) {
	t.Helper()
	for s := range uint16(keyslot.Count) {
		require.Equal(t, c.PrimaryForSlot(int(s)).Addr, m.node(s), "slot %d", s)
	}
	assert.Equal(t, "", m.node(keyslot.Count), "out of range")
	nodes := m.nodes()
	assert.Len(t, nodes, 3)
	if rc == nil {
		return
	}
	known := rc.Nodes()
	for _, n := range nodes {
		assert.Contains(t, known, n, "rueidis names the node %s the same", n)
	}
}

// TestSlotMapTLS: over TLS, the slot map names each primary by its TLS
// port, as rueidis does, though CLUSTER SHARDS names its plain port too;
// without TLS, by its plain port.
func TestSlotMapTLS(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterTLS())
	o, err := Options{Addrs: c.TLSAddrs()[:1], Mode: Cluster, DialTimeout: time.Second,
		TLS: redistest.ClientTLS(t, c.CAFile)}.withDefaults()
	require.NoError(t, err)
	rc, err := rueidis.NewClient(o.rueidisOption())
	require.NoError(t, err)
	t.Cleanup(rc.Close)

	m := slotMap{tls: true}
	require.NoError(t, m.refresh(context.Background(), rc))
	known := rc.Nodes()
	for s := range uint16(keyslot.Count) {
		require.Equal(t, c.PrimaryForSlot(int(s)).TLSAddr, m.node(s), "slot %d", s)
	}
	for _, n := range m.nodes() {
		assert.Contains(t, known, n, "rueidis names the node %s the same", n)
	}

	plain := slotMap{}
	require.NoError(t, plain.refresh(context.Background(), rc))
	for s := range uint16(keyslot.Count) {
		require.Equal(t, c.PrimaryForSlot(int(s)).Addr, plain.node(s), "slot %d without TLS", s)
	}
}

func BenchmarkSlot(b *testing.B) {
	key := string(AppendKey(nil, "rld:", []byte("api_key=0123456789abcdef|endpoint=/v1/search"), algo.TokenBucket))
	var m slotMap
	var tab slotTable
	tab.addrs = []string{"127.0.0.1:7000"}
	for s := range tab.owner {
		tab.owner[s] = 1
	}
	m.t.Store(&tab)
	b.ReportAllocs()
	for b.Loop() {
		if m.node(keyslot.Of(key)) == "" {
			b.Fatal("no node")
		}
	}
}

// TestSlotRouteTrust: route gives a slot's breaker and its node's client,
// the client only while the table is younger than nodeTrust (rueidis may
// have closed the connection of an older one's node).
func TestSlotRouteTrust(t *testing.T) {
	var b tableBuilder
	require.NoError(t, b.add(0, keyslot.Count-1, "192.0.2.1:6379"))
	tab := &b.t
	br := newBreaker("route-trust-test:6379", breaker.Options{})
	tab.brk = []*breaker.Breaker{br}
	tab.node = []rueidis.Client{directClient{}}
	tab.at = time.Now().UnixNano()
	var m slotMap
	m.t.Store(tab)
	got, node := m.route(keyslot.Of("k"))
	assert.Same(t, br, got)
	assert.NotNil(t, node, "a fresh table's node client")

	tab.at -= int64(nodeTrust)
	got, node = m.route(keyslot.Of("k"))
	assert.Same(t, br, got, "the breaker does not age")
	assert.Nil(t, node, "no node client from a table older than nodeTrust: rueidis routes")

	tab.node = nil // a table whose refresh knew no node
	tab.at = time.Now().UnixNano()
	got, node = m.route(keyslot.Of("k"))
	assert.Same(t, br, got)
	assert.Nil(t, node)
}
