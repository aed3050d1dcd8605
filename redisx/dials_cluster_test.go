package redisx

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/redistest"
)

// TestCallDoesNotWaitOnRefreshDial: rueidis's refresh of its slot map
// dials a Cluster node's broken connection again with a context that
// never ends; with the node paused that set-up lasts the dial timeout.
// It is counted, and a call to the node meanwhile ends at its own
// deadline, not at the set-up's.
func TestCallDoesNotWaitOnRefreshDial(t *testing.T) {
	cl := redistest.StartCluster(t)
	c, err := New(context.Background(), Options{Addrs: cl.Addrs(), Mode: Cluster, Timeout: 5 * time.Millisecond})
	require.NoError(t, err)
	defer c.Close()
	p := cl.Primaries()[0]
	var key string
	for i := 0; cl.PrimaryFor(key) != p; i++ {
		key = fmt.Sprintf("k%d", i)
	}
	script := rueidis.NewLuaScript("return 1")
	redistest.WaitFor(t, "a call to the node", func() bool {
		_, err := c.exec(context.Background(), script, key, nil)
		return err == nil
	})
	// Break the client's connections to the node, then pause it: the
	// next refresh of rueidis dials it again with a context that never
	// ends, and waits for its handshake.
	refreshDial := make(chan struct{})
	var once sync.Once
	seen := func(ctx context.Context, addr string) {
		if addr == p.Addr && ctx.Done() == nil {
			once.Do(func() { close(refreshDial) })
		}
	}
	c.dials.seen.Store(&seen)
	_, err = redistest.Do(p.Addr, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
	require.NoError(t, err)
	p.Pause()
	defer p.Resume()
	select {
	case <-refreshDial:
	case <-time.After(10 * time.Second):
		t.Fatal("rueidis did not dial the node again")
	}
	start := time.Now()
	_, err = c.exec(context.Background(), script, key, nil)
	took := time.Since(start)
	assert.Less(t, took, 200*time.Millisecond, "the call waited on the set-up (the dial timeout is 500ms)")
	if err == nil {
		// Only another node can have answered: the paused one's replica,
		// promoted meanwhile (cluster-node-timeout is 1 s, and the wait
		// for the refresh's dial may outlast it on a loaded host).
		assert.True(t, servedElsewhere(t, cl, p, key), "the paused node cannot answer")
	}
}

// servedElsewhere reports whether a node other than p serves key's slot
// as a primary, as another node's CLUSTER NODES says.
func servedElsewhere(t *testing.T, cl *redistest.Cluster, p *redistest.Server, key string) bool {
	t.Helper()
	slot := redistest.Slot(key)
	for _, n := range cl.Primaries() {
		if n == p {
			continue
		}
		out, err := redistest.Do(n.Addr, "CLUSTER", "NODES")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") || strings.HasPrefix(f[1], p.Addr+"@") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, _ := strings.Cut(r, "-")
				a, errA := strconv.Atoi(lo)
				b, errB := strconv.Atoi(hi)
				if hi == "" {
					b, errB = a, errA
				}
				if errA == nil && errB == nil && a <= slot && slot <= b {
					return true
				}
			}
		}
		return false
	}
	return false
}
