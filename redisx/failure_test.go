package redisx

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/redistest"
)

// errApp is an error of rld's making, not Redis's: not a failure.
var errApp = fmt.Errorf("script replied 3 integers, want 5")

// TestIsFailure classifies errors provoked from real Redis servers.
func TestIsFailure(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	rc := newRueidis(t, srv.Addr)
	do := func(args ...string) error {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return rc.Do(cctx, rc.B().Arbitrary(args...).Build()).Error()
	}
	require.NoError(t, do("SET", "str", "v"))

	t.Run("answers of a healthy redis", func(t *testing.T) { healthyAnswers(t, rc, do) })
	t.Run("unavailable replies", func(t *testing.T) { unavailableReplies(t, do) })
	t.Run("no connection", noConnection)
	t.Run("timeout", func(t *testing.T) { timeoutFailure(t, srv.Addr) })
	t.Run("connection reset", func(t *testing.T) { resetFailure(t, srv.Addr) })
}

// healthyAnswers: the errors of a healthy Redis are no failures.
func healthyAnswers(t *testing.T, rc rueidis.Client, do func(args ...string) error) {
	ctx := context.Background()
	for _, args := range [][]string{
		{"LPUSH", "str", "x"},                                       // WRONGTYPE
		{"NOSUCHCOMMAND"},                                           // ERR unknown command
		{"EVAL", "return redis.call('nosuch')", "0"},                // script error
		{"EVAL", "error('boom')", "0"},                              // script error
		{"EVAL", "return redis.error_reply('BUSYGROUP x')", "0"},    // not BUSY
		{"EVAL", "return redis.error_reply('CUSTOM failure')", "0"}, // a script's own error
		{"EVALSHA", strings.Repeat("0", 40), "0"},                   // NOSCRIPT
	} {
		err := do(args...)
		require.Error(t, err, "%v", args)
		_, isRedis := rueidis.IsRedisErr(err)
		assert.True(t, isRedis, "%v: %v", args, err)
		assert.False(t, isFailure(err), "%v: %v", args, err)
		assert.False(t, isFailure(fmt.Errorf("redisx: take: %w", err)), "wrapped %v", args)
	}
	_, err := rc.Do(ctx, rc.B().Get().Key("missing").Build()).ToString()
	assert.True(t, rueidis.IsRedisNil(err))
	assert.False(t, isFailure(err), "nil reply %v", err)
	assert.False(t, isFailure(nil))
	assert.False(t, isFailure(errApp))
	assert.False(t, isFailure(context.Canceled))
	assert.False(t, isFailure(ErrClosed))
}

// unavailableReplies: the replies of a Redis that cannot serve are failures.
func unavailableReplies(t *testing.T, do func(args ...string) error) {
	ctx := context.Background()
	for _, word := range []string{"CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN", "BUSY", "MISCONF", "NOREPLICAS", "OOM"} {
		err := do("EVAL", "return redis.error_reply('"+word+" said the test')", "0")
		assert.True(t, isFailure(err), "%s: %v", word, err)
		assert.True(t, isFailure(fmt.Errorf("redisx: take: %w", err)), "wrapped %s", word)
	}
	// The real thing: a replica refuses writes (READONLY), and, told not
	// to serve stale data, everything while its primary is down
	// (MASTERDOWN).
	replica := redistest.Standalone(t)
	dead := redistest.Standalone(t)
	dead.Kill()
	_, err := redistest.Do(replica.Addr, "REPLICAOF", "127.0.0.1", fmt.Sprint(dead.Port))
	require.NoError(t, err)
	rr := newRueidis(t, replica.Addr)
	err = rr.Do(ctx, rr.B().Set().Key("k").Value("v").Build()).Error()
	assert.ErrorContains(t, err, "READONLY")
	assert.True(t, isFailure(err), "%v", err)
	_, err = redistest.Do(replica.Addr, "CONFIG", "SET", "replica-serve-stale-data", "no")
	require.NoError(t, err)
	err = rr.Do(ctx, rr.B().Get().Key("k").Build()).Error()
	assert.ErrorContains(t, err, "MASTERDOWN")
	assert.True(t, isFailure(err), "%v", err)
}

// noConnection: a server that is not there is a failure; a closed Client is not.
func noConnection(t *testing.T) {
	ctx := context.Background()
	dead := redistest.Standalone(t)
	dead.Kill()
	dc := newRueidis(t, dead.Addr)
	err := dc.Do(ctx, dc.B().Ping().Build()).Error()
	require.Error(t, err)
	t.Logf("a stopped server: %T: %v", err, err)
	assert.True(t, isFailure(err), "%T %v", err, err)

	c, err := New(ctx, Options{Addrs: []string{dead.Addr}, Mode: Cluster})
	require.NoError(t, err)
	defer c.Close()
	err = c.Ping(ctx)
	require.ErrorIs(t, err, ErrNotConnected)
	assert.True(t, isFailure(err), "%v", err)
	c.Close()
	err = c.Ping(ctx)
	require.ErrorIs(t, err, ErrClosed)
	assert.False(t, isFailure(err), "%v", err)
}

// timeoutFailure: a call that meets its deadline is a failure.
func timeoutFailure(t *testing.T, addr string) {
	ctx := context.Background()
	p := redistest.StartProxy(t, addr)
	pc := newRueidis(t, p.Addr())
	require.NoError(t, pc.Do(ctx, pc.B().Ping().Build()).Error())
	p.Blackhole()
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	err := pc.Do(cctx, pc.B().Ping().Build()).Error()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, isFailure(err), "%v", err)
	p.Heal() // or closing the client waits for the held PING
}

// resetFailure: a connection reset under a call is a failure, and no timeout.
func resetFailure(t *testing.T, addr string) {
	ctx := context.Background()
	p := redistest.StartProxy(t, addr)
	pc := newRueidis(t, p.Addr())
	// A BLPOP is in flight once redis counts it blocked; then the
	// connection is reset under it.
	errc := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		errc <- pc.Do(cctx, pc.B().Blpop().Key("empty").Timeout(10).Build()).Error()
	}()
	redistest.WaitFor(t, "the BLPOP to block", func() bool {
		info, err := redistest.Do(addr, "INFO", "clients")
		return err == nil && strings.Contains(info, "blocked_clients:1")
	})
	p.Drop()
	err := <-errc
	require.Error(t, err)
	t.Logf("a reset connection: %T: %v", err, err)
	assert.False(t, IsTimeout(err), "the reset, not a deadline: %v", err)
	assert.True(t, isFailure(err), "%T %v", err, err)
}

// newRueidis returns a rueidis client on the standalone redis at addr,
// configured like a Client's, closed when t ends.
func newRueidis(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	o := Options{Addrs: []string{addr}}
	o, err := o.withDefaults()
	require.NoError(t, err)
	rc, err := rueidis.NewClient(o.rueidisOption())
	if rc == nil {
		require.NoError(t, err)
	}
	t.Cleanup(rc.Close)
	return rc
}
