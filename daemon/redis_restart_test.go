package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// answerLog records, for each failed check, when it was sent and
// answered, so the test can tell errors during an outage from others.
type answerLog struct {
	mu       sync.Mutex // guards errors and degraded
	errors   []span
	degraded []span // answers made by the rules' fail modes

	ok atomic.Int64
}

type span struct {
	sent, got time.Time
	err       string
}

// hammer sends checks for every fleet algorithm from n goroutines until
// ctx is done.
func hammer(ctx context.Context, socket string, n int, log *answerLog) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range n {
		c := client.New(socket)
		descs := []client.Descriptor{{Name: "api_key", Value: fmt.Sprintf("k%d", i)}, {Name: "alg", Value: fleetKinds[i%len(fleetKinds)].String()}}
		wg.Go(func() {
			defer c.Close()
			for ctx.Err() == nil {
				sent := time.Now()
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := c.Check(cctx, descs, 1)
				cancel()
				if err == nil && r.Degraded {
					log.mu.Lock()
					log.degraded = append(log.degraded, span{sent, time.Now(), r.Status.String()})
					log.mu.Unlock()
					continue
				}
				if err == nil && r.Status != wire.StatusAllowed {
					err = fmt.Errorf("status %s", r.Status)
				}
				if err != nil {
					log.mu.Lock()
					log.errors = append(log.errors, span{sent, time.Now(), err.Error()})
					log.mu.Unlock()
				} else {
					log.ok.Add(1)
				}
				time.Sleep(time.Millisecond) // pacing, not synchronising
			}
		})
	}
	return &wg
}

// TestRedisRestart: clients check through a daemon while Redis's script
// cache is flushed and while Redis is killed and started again (which
// also loses the scripts). Checks succeed after the flush (EVALSHA falls
// back to EVAL); no error reaches a client; answers are degraded (the
// rules fail open) only during the outage and until the circuit breaker
// closes, within a second of Redis being back.
func TestRedisRestart(t *testing.T) {
	srv := redistest.Standalone(t)
	d, err := daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]", srv.Addr), 10_000, "strict"))
	require.NoError(t, err)
	t.Cleanup(d.Close)

	var log answerLog
	ctx, stop := context.WithCancel(context.Background())
	wg := hammer(ctx, d.Socket, 10, &log)
	waitOK := func(what string, n int64) {
		t.Helper()
		from := log.ok.Load()
		redistest.WaitFor(t, what, func() bool { return log.ok.Load() >= from+n })
	}

	waitOK("checks before the flush", 200)
	_, err = redistest.Do(srv.Addr, "SCRIPT", "FLUSH")
	require.NoError(t, err)
	waitOK("checks after the flush", 200)

	down := time.Now()
	srv.Kill()
	time.Sleep(100 * time.Millisecond) // an outage of 100 ms at least
	srv.Start(t)
	up := time.Now()
	waitOK("checks after the restart", 500)
	stop()
	wg.Wait()

	log.mu.Lock()
	defer log.mu.Unlock()
	for _, e := range log.errors {
		t.Errorf("error (sent %v, answered %v after the outage began): %s", e.sent.Sub(down), e.got.Sub(down), e.err)
	}
	for _, e := range log.degraded {
		if e.got.Before(down) || e.sent.After(up.Add(time.Second)) {
			t.Errorf("degraded answer outside the outage and its recovery (sent %v, answered %v after it began): %s",
				e.sent.Sub(down), e.got.Sub(down), e.err)
		}
	}
	t.Logf("%d checks allowed; %d degraded answers, all during the %v outage or the second after", log.ok.Load(), len(log.degraded), up.Sub(down).Round(time.Millisecond))
	assert.Positive(t, len(log.degraded), "the clients saw the outage")
}

// TestRedisDownAtStart: a daemon whose Redis is down starts anyway, about
// a second later, and answers by its rules' fail modes (degraded), then
// decides in Redis as soon as Redis is up.
func TestRedisDownAtStart(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	srv.Kill()
	begin := time.Now()
	d, err := daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]", srv.Addr), 10, "strict"))
	require.NoError(t, err, "starts while redis is down")
	// It waits a second for Redis, then serves: not the 5 s a load of the
	// overrides and blocks may take when Redis answers.
	assert.Less(t, time.Since(begin), 4*time.Second, "serving took too long")
	t.Cleanup(d.Close)
	c := client.New(d.Socket)
	defer c.Close()
	descs := []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "alg", Value: "gcra"}}
	r, err := c.Check(context.Background(), descs, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusAllowedDegraded, r.Status, "the rule fails open")
	assert.True(t, r.Degraded)

	srv.Start(t)
	redistest.WaitFor(t, "the daemon to reach redis", func() bool {
		r, err := c.Check(context.Background(), descs, 1)
		return err == nil && r.Status == wire.StatusAllowed && !r.Degraded
	})
}

// TestStandaloneAsCluster: a plain Redis named as a Cluster stops the
// daemon from starting, with an error naming the store and the fix.
func TestStandaloneAsCluster(t *testing.T) {
	srv := redistest.Standalone(t)
	_, err := daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]\nmode = \"cluster\"", srv.Addr), 10, "strict"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `cannot use store.redis: store.mode = "cluster", but the Redis at `+srv.Addr+` reports redis_mode standalone: it is not a Cluster node`)
}

// TestPlainRedisAsSentinels: a plain Redis named as the sentinels stops
// the daemon from starting, with an error that says so.
func TestPlainRedisAsSentinels(t *testing.T) {
	srv := redistest.Standalone(t)
	_, err := daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]\nmode = \"sentinel\"\nmaster_set = \"m\"", srv.Addr), 10, "strict"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot use store.redis: redisx: "+srv.Addr+" is not a sentinel (it does not know SENTINEL)")
}

// TestStandaloneAsClusterFoundLater: a daemon that started while its
// Redis was silent checks the kind of Redis once it answers, and logs the
// mismatch as an error (it can no longer refuse to start).
func TestStandaloneAsClusterFoundLater(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	srv.Kill()
	l := startLogged(t, t.TempDir(), fleetConfig(fmt.Sprintf("redis = [%q]\nmode = \"cluster\"", srv.Addr), 10, "strict"))
	srv.Start(t)
	redistest.WaitFor(t, "the mismatch in the log", func() bool {
		return strings.Contains(l.logs.String(), `store.mode = \"cluster\", but the Redis at `+srv.Addr+` reports redis_mode standalone`)
	})
	assert.Contains(t, l.logs.String(), "level=ERROR")
}

// TestRedisRefusesDaemon: a password Redis rejects stops the daemon from
// starting, with an error naming the store.
func TestRedisRefusesDaemon(t *testing.T) {
	srv := redistest.Standalone(t)
	_, err := redistest.Do(srv.Addr, "CONFIG", "SET", "requirepass", "secret")
	require.NoError(t, err)
	_, err = daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]\npassword = \"wrong\"", srv.Addr), 10, "strict"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cannot use store.redis")
	assert.Contains(t, err.Error(), "WRONGPASS")

	d, err := daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]\npassword = \"secret\"", srv.Addr), 10, "strict"))
	require.NoError(t, err)
	defer d.Close()
	r, err := client.New(d.Socket).Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "alg", Value: "fixed_window"}}, 1)
	require.NoError(t, err)
	assert.Equal(t, wire.StatusAllowed, r.Status)
}
