package redisx

import (
	"context"
	"fmt"
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
	assert.Error(t, err, "the paused node cannot answer")
}
