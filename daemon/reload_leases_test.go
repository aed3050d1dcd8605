package daemon_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/wire"
)

const leaseConfig = `
[[rule]]
name = "tokens"
match = { endpoint = "/v1/chat" }
by = ["api_key"]
limit = 100
period = "1h"

[[rule]]
name = "exports"
algorithm = "concurrency"
match = { endpoint = "/v1/chat" }
by = ["api_key"]
limit = 2
timeout = "1m"
`

// TestReloadKeepsLeases: a daemon with no lease_key_file signs leases
// with a random key of its own, which a reload keeps, as it keeps the
// record of the leases settled: a lease acquired before a reload is
// released and settled after it, and settled once.
func TestReloadKeepsLeases(t *testing.T) {
	s := start(t, leaseConfig)
	c := client.New(s.Socket)
	defer c.Close()
	ctx := context.Background()
	chat := []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "endpoint", Value: "/v1/chat"}}
	acquire := func() string {
		t.Helper()
		res, err := c.Acquire(ctx, chat, 10)
		require.NoError(t, err)
		require.Equal(t, wire.StatusAllowed, res.Status)
		require.NotEmpty(t, res.Lease)
		return res.Lease
	}
	settled, released := acquire(), acquire()
	_, err := c.Settle(ctx, settled, 4)
	require.NoError(t, err, "settled before the reload")

	require.NoError(t, os.WriteFile(s.ConfigPath, []byte(strings.Replace(leaseConfig, "limit = 100", "limit = 200", 1)), 0o644))
	require.NoError(t, s.Daemon.Reload())

	_, err = c.Settle(ctx, settled, 4)
	var re *client.ResponseError
	require.True(t, errors.As(err, &re), "a second settle after the reload: %v", err)
	assert.Equal(t, wire.CodeNotFound, re.Code, "settled once, across the reload")
	_, err = c.Release(ctx, released)
	assert.NoError(t, err, "the lease of before the reload verifies after it")
	_, err = c.Settle(ctx, released, 10)
	assert.NoError(t, err, "and is settled once")
}
