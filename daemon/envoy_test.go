package daemon_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/envoyrls"
)

// TestEnvoyFace: with [envoy], the daemon serves Envoy's rate limit
// service on TCP and on a Unix socket, both counting against the policy
// in force (a reload swaps it for the face too); the drain on shutdown
// closes both listeners and removes the socket.
func TestEnvoyFace(t *testing.T) {
	sockDir, err := os.MkdirTemp("", "rlse")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "rls.sock")
	conf := func(limit int) string {
		return fmt.Sprintf(`[envoy]
listen = "127.0.0.1:0"
socket = %q

[[rule]]
name = "edge.remote_address"
match = { domain = "edge", envoy_keys = "remote_address" }
by = ["remote_address"]
algorithm = "fixed_window"
limit = %d
period = "1h"
`, sock, limit)
	}
	s, err := daemontest.Start(conf(3))
	require.NoError(t, err)
	t.Cleanup(s.Close)
	addrs := s.Daemon.EnvoyAddrs()
	require.Len(t, addrs, 2)
	assert.Equal(t, sock, addrs[1])

	tcp, err := envoyrls.Dial(addrs[0])
	require.NoError(t, err)
	defer tcp.Close()
	unix, err := envoyrls.Dial("unix:" + sock)
	require.NoError(t, err)
	defer unix.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	desc := [][]envoyrls.Entry{{{Key: "remote_address", Value: "192.0.2.7"}}}
	var codes []string
	for i := range 4 {
		c := tcp
		if i%2 == 1 {
			c = unix
		}
		r, err := c.Check(ctx, "edge", desc, 1)
		require.NoError(t, err)
		codes = append(codes, r.Code)
	}
	assert.Equal(t, []string{"OK", "OK", "OK", "OVER_LIMIT"}, codes, "one limit across both listeners")

	require.NoError(t, os.WriteFile(s.ConfigPath, []byte(conf(5)), 0o644))
	require.NoError(t, s.Daemon.Reload())
	r, err := unix.Check(ctx, "edge", desc, 1)
	require.NoError(t, err)
	assert.Equal(t, "OK", r.Code)
	assert.Equal(t, uint32(5), r.Statuses[0].Limit, "the reloaded rule")
	assert.Equal(t, uint32(1), r.Statuses[0].Remaining)

	require.NoError(t, s.Stop())
	_, err = os.Stat(sock)
	assert.True(t, os.IsNotExist(err), "the socket is removed: %v", err)
	_, err = net.DialTimeout("tcp", addrs[0], time.Second)
	assert.Error(t, err, "the TCP listener is closed")
	_, err = tcp.Check(ctx, "edge", desc, 1)
	assert.Error(t, err, "no answer after the drain")
}
