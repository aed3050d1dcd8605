package redisx_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// TestHeartbeat: three daemons beat; one stops and drops out after its
// ttl, one leaves and drops out at once.
func TestHeartbeat(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, KeyPrefix: "hb:"}))
	ctx := context.Background()
	beat := func(id string, ttl time.Duration) int {
		t.Helper()
		live, err := rs.Heartbeat(ctx, id, ttl)
		require.NoError(t, err)
		return live
	}
	assert.Equal(t, 1, beat("a", time.Minute))
	assert.Equal(t, 2, beat("b", time.Minute))
	assert.Equal(t, 3, beat("c", 200*time.Millisecond))
	assert.Equal(t, 3, beat("a", time.Minute), "a second beat counts once")
	n, err := redistest.Do(srv.Addr, "ZCARD", "hb:daemons")
	require.NoError(t, err)
	assert.Equal(t, "3", n, "the registry's key")

	// c stops beating: it drops out once its ttl has passed.
	start := time.Now()
	redistest.WaitFor(t, "c to expire", func() bool { return beat("a", time.Minute) == 2 })
	assert.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "c counted as live for its ttl")

	require.NoError(t, rs.Leave(ctx, "b"))
	require.NoError(t, rs.Leave(ctx, "b"), "leaving twice")
	assert.Equal(t, 1, beat("a", time.Minute))

	// A short ttl does not cut the others' (each member has its own
	// deadline), and the key lives as long as the longest.
	assert.Equal(t, 2, beat("d", time.Millisecond))
	pttl, err := redistest.Do(srv.Addr, "PTTL", "hb:daemons")
	require.NoError(t, err)
	assert.Greater(t, pttl, "5000", "PTTL %s ms", pttl) // string compare: both have 5 digits
	redistest.WaitFor(t, "d to expire", func() bool { return beat("a", time.Minute) == 1 })

	// The key expires after the last beat's ttl: no daemon left.
	require.NoError(t, rs.Leave(ctx, "a"))
	assert.Equal(t, 1, beat("e", 100*time.Millisecond))
	redistest.WaitFor(t, "the registry to expire", func() bool {
		n, err := redistest.Do(srv.Addr, "EXISTS", "hb:daemons")
		return err == nil && n == "0"
	})

	for _, bad := range []struct {
		id  string
		ttl time.Duration
	}{{"", time.Second}, {"x", 0}, {"x", -time.Second}} {
		_, err := rs.Heartbeat(ctx, bad.id, bad.ttl)
		assert.Error(t, err, "%+v", bad)
	}
	assert.Error(t, rs.Leave(ctx, ""))
}

// TestHeartbeatScriptLoss: a heartbeat after SCRIPT FLUSH succeeds (EVAL
// fallback).
func TestHeartbeatScriptLoss(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	_, err := rs.Heartbeat(context.Background(), "a", time.Minute)
	require.NoError(t, err)
	_, err = redistest.Do(srv.Addr, "SCRIPT", "FLUSH")
	require.NoError(t, err)
	live, err := rs.Heartbeat(context.Background(), "a", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 1, live)
}
