package redisx_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/breaker"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// metricValue returns the value of the series name in the exposition of
// the default metrics set (0 when absent).
func metricValue(t *testing.T, name string) float64 {
	t.Helper()
	var buf bytes.Buffer
	metrics.WritePrometheus(&buf, false)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(buf.Bytes())
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}

// TestBreakerGuardsCalls: with Redis blackholed, the first calls time
// out, the breaker opens, and from then on every call of the Store
// (take, batch of ops, heartbeat) is refused at once with a
// *breaker.OpenError, without waiting on Redis; the breaker's probes
// close it within about its cool-down once Redis answers again.
func TestBreakerGuardsCalls(t *testing.T) {
	srv := redistest.Standalone(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	const timeout, cooldown = 50 * time.Millisecond, 100 * time.Millisecond
	c := newClient(t, redisx.Options{Addrs: []string{proxy.Addr()}, Timeout: timeout,
		Breaker: breaker.Options{Failures: 3, Window: time.Second, Cooldown: cooldown}})
	rs := redisx.NewStore(c)
	ctx := context.Background()
	p := algo.Params{Limit: 1000, Period: time.Hour}
	take := func() error {
		_, err := rs.Take(ctx, []byte("guarded"), p, 1, time.Now(), false)
		return err
	}
	require.NoError(t, take())
	assert.Equal(t, []redisx.BreakerStatus{{Node: proxy.Addr(), State: breaker.Closed}}, c.Breakers())
	assert.False(t, c.Degraded())
	assert.True(t, c.RetryAt().IsZero())

	refusedBefore := metricValue(t, `rld_redis_calls_total{op="take",result="breaker_open"}`)
	proxy.Blackhole()
	timeouts := 0
	var err error
	for err = take(); !errors.Is(err, breaker.ErrOpen); err = take() {
		require.ErrorIs(t, err, context.DeadlineExceeded)
		timeouts++
	}
	assert.Equal(t, 3, timeouts, "the breaker opens after Failures timeouts")
	var oe *breaker.OpenError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, proxy.Addr(), oe.Name)
	assert.WithinDuration(t, time.Now().Add(cooldown), oe.RetryAt, cooldown)
	assert.Equal(t, oe.RetryAt, oe.NextTry())
	assert.True(t, c.Degraded())
	assert.Equal(t, breaker.Open, c.Breakers()[0].State)
	assert.False(t, c.RetryAt().IsZero())
	// The breaker's metrics keep the names the dashboards and alerts use.
	node := `node="` + proxy.Addr() + `"`
	assert.Equal(t, float64(breaker.Open), metricValue(t, `rld_redis_breaker_state{`+node+`}`))
	assert.Positive(t, metricValue(t, `rld_redis_breaker_transitions_total{`+node+`,to="open"}`))

	// Refused calls do not wait on Redis.
	start := time.Now()
	for range 100 {
		require.ErrorIs(t, take(), breaker.ErrOpen)
	}
	assert.Less(t, time.Since(start), timeout, "100 refused calls take less than one timeout")
	assert.GreaterOrEqual(t, metricValue(t, `rld_redis_calls_total{op="take",result="breaker_open"}`)-refusedBefore, float64(101))

	ops := []algo.Op{{Kind: algo.OpLease, Key: []byte("a"), Params: p, N: 5}, {Kind: algo.OpPeek, Key: []byte("b"), Params: p, N: 1}}
	err = rs.Do(ctx, ops)
	assert.ErrorIs(t, err, breaker.ErrOpen, "nothing sent")
	for _, o := range ops {
		assert.ErrorIs(t, o.Err, breaker.ErrOpen)
	}
	_, err = rs.Heartbeat(ctx, "d", time.Second)
	assert.ErrorIs(t, err, breaker.ErrOpen)

	// Probes go in the background while the proxy holds them; healed,
	// the breaker closes at its next probe.
	healed := time.Now()
	proxy.Heal()
	redistest.WaitFor(t, "the breaker to close", func() bool { return !c.Degraded() })
	t.Logf("breaker closed %v after redis answered again (cool-down %v)", time.Since(healed).Round(time.Millisecond), cooldown)
	assert.Less(t, time.Since(healed), cooldown+time.Second)
	require.NoError(t, take())
	require.NoError(t, rs.Do(ctx, ops))
	for _, o := range ops {
		assert.NoError(t, o.Err)
	}
}

// TestBreakerPerClusterNode: in a Cluster, a killed primary's breaker
// opens and refuses the calls for its slots, while the keys of the other
// primaries are decided as before, alone or in a batch with its keys; after the failover the slot map names
// the promoted replica, whose breaker is closed, and the killed node's
// breaker is gone.
func TestBreakerPerClusterNode(t *testing.T) {
	cl := redistest.StartCluster(t, redistest.AllowPartialCoverage())
	c := newClient(t, redisx.Options{Addrs: cl.Addrs()[:1], Mode: redisx.Cluster, Timeout: 200 * time.Millisecond})
	rs := redisx.NewStore(c)
	ctx := context.Background()
	p := algo.Params{Limit: 1_000_000, Period: time.Hour}
	primaries := cl.Primaries()
	keys := map[string][]byte{} // by primary address
	for i := 0; len(keys) < len(primaries); i++ {
		key := []byte(fmt.Sprintf("node-%d", i))
		keys[cl.PrimaryFor(string(redisx.AppendKey(nil, "t:", key, p.Kind))).Addr] = key
	}
	redistest.WaitFor(t, "a breaker per primary", func() bool { return len(c.Breakers()) == 1+len(primaries) })
	for _, key := range keys {
		_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
		require.NoError(t, err)
	}

	killed := primaries[0]
	killed.Kill()
	killedAt := time.Now()
	for {
		_, err := rs.Take(ctx, keys[killed.Addr], p, 1, time.Now(), false)
		if errors.Is(err, breaker.ErrOpen) {
			break
		}
		require.Error(t, err)
		require.Less(t, time.Since(killedAt), 10*time.Second, "the breaker never opened")
	}
	t.Logf("the killed primary's breaker opened %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	for _, b := range c.Breakers() {
		if b.Node == killed.Addr {
			assert.Contains(t, []breaker.State{breaker.Open, breaker.HalfOpen}, b.State, b.Node)
		} else {
			assert.Equal(t, breaker.Closed, b.State, b.Node)
		}
	}
	for _, other := range primaries[1:] {
		for range 20 {
			_, err := rs.Take(ctx, keys[other.Addr], p, 1, time.Now(), false)
			require.NoError(t, err, "a key of %s while %s is down", other.Addr, killed.Addr)
		}
	}
	// A batch with a key on each primary: the killed one's share is
	// refused by its breaker, the others' are sent and decided.
	ops := make([]algo.Op, 0, len(primaries))
	for _, pr := range primaries {
		ops = append(ops, algo.Op{Kind: algo.OpTake, Key: keys[pr.Addr], Params: p, N: 1})
	}
	require.NoError(t, rs.Do(ctx, ops), "some ops were sent")
	for i, pr := range primaries {
		if pr == killed {
			assert.ErrorIs(t, ops[i].Err, breaker.ErrOpen, "the killed primary's op")
			continue
		}
		assert.NoError(t, ops[i].Err, "op of %s", pr.Addr)
		assert.True(t, ops[i].Result.Allowed, "op of %s", pr.Addr)
	}

	promoted := cl.WaitFailover(t, killed)
	redistest.WaitFor(t, "the killed primary's keys to be decided again", func() bool {
		_, err := rs.Take(ctx, keys[killed.Addr], p, 1, time.Now(), false)
		return err == nil
	})
	t.Logf("keys of the killed primary decided again %v after the kill (on %s)", time.Since(killedAt).Round(time.Millisecond), promoted.Addr)
	redistest.WaitFor(t, "the killed node's breaker to go", func() bool {
		for _, b := range c.Breakers() {
			if b.Node == killed.Addr {
				return false
			}
		}
		return true
	})
	// The unmapped slots' breaker may have opened while the shard had
	// no primary; its probes close it.
	redistest.WaitFor(t, "every breaker to close", func() bool { return !c.Degraded() })
	for _, b := range c.Breakers() {
		assert.Equal(t, breaker.Closed, b.State, b.Node)
	}
}

// TestClusterTLSBreakerCloses: over TLS, on a Cluster whose nodes serve
// plain clients too, each primary's breaker is named by its TLS address
// (the one rueidis dials), so that a breaker opened by a paused primary
// is closed by its probes once the primary answers again.
func TestClusterTLSBreakerCloses(t *testing.T) {
	cl := redistest.StartCluster(t, redistest.ClusterTLS())
	c := newClient(t, redisx.Options{Addrs: cl.TLSAddrs()[:1], Mode: redisx.Cluster, Timeout: 50 * time.Millisecond,
		TLS: redistest.ClientTLS(t, cl.CAFile)})
	rs := redisx.NewStore(c)
	ctx := context.Background()
	p := algo.Params{Limit: 1_000_000, Period: time.Hour}
	primaries := cl.Primaries()
	redistest.WaitFor(t, "a breaker per primary", func() bool { return len(c.Breakers()) == 1+len(primaries) })
	names := map[string]bool{}
	for _, b := range c.Breakers() {
		names[b.Node] = true
	}
	for _, pr := range primaries {
		assert.True(t, names[pr.TLSAddr], "a breaker named %s, the TLS address of %s (breakers %v)", pr.TLSAddr, pr.Addr, names)
	}

	paused := primaries[0]
	var key []byte
	for i := 0; key == nil; i++ {
		k := []byte(fmt.Sprintf("tls-node-%d", i))
		if cl.PrimaryFor(string(redisx.AppendKey(nil, "t:", k, p.Kind))) == paused {
			key = k
		}
	}
	_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
	require.NoError(t, err)
	paused.Pause()
	pausedAt := time.Now()
	for {
		_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
		if errors.Is(err, breaker.ErrOpen) {
			break
		}
		require.Less(t, time.Since(pausedAt), 10*time.Second, "the breaker never opened")
	}
	paused.Resume()
	redistest.WaitFor(t, "the paused primary's breaker to close", func() bool { return !c.Degraded() })
	_, err = rs.Take(ctx, key, p, 1, time.Now(), false)
	assert.NoError(t, err, "a key of the paused primary, once it answers again")
}

// TestClusterDownKeepsBreakersOpen: a shard lost whole (its primary and
// its replica killed) puts a Cluster that needs full coverage in
// cluster_state:fail: the other nodes still answer PING, but refuse every
// key with CLUSTERDOWN. A surviving primary's breaker opens and stays
// open while that lasts, its probes (CLUSTER INFO) failing, and closes
// once the shard is back.
func TestClusterDownKeepsBreakersOpen(t *testing.T) {
	cl := redistest.StartCluster(t)
	const cooldown = 100 * time.Millisecond
	c := newClient(t, redisx.Options{Addrs: cl.Addrs()[:1], Mode: redisx.Cluster, Timeout: 200 * time.Millisecond,
		Breaker: breaker.Options{Failures: 3, Window: time.Second, Cooldown: cooldown}})
	rs := redisx.NewStore(c)
	ctx := context.Background()
	p := algo.Params{Limit: 1_000_000, Period: time.Hour}
	primaries := cl.Primaries()
	lost, survivor := primaries[0], primaries[1]
	var key []byte // a key of the surviving primary
	for i := 0; key == nil; i++ {
		k := []byte(fmt.Sprintf("down-%d", i))
		if cl.PrimaryFor(string(redisx.AppendKey(nil, "t:", k, p.Kind))) == survivor {
			key = k
		}
	}
	redistest.WaitFor(t, "a breaker per primary", func() bool { return len(c.Breakers()) == 1+len(primaries) })
	_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
	require.NoError(t, err)
	var lostReplica *redistest.Server
	for _, n := range cl.Nodes() {
		if n.Role == redistest.RoleReplica && n.Primary == lost {
			lostReplica = n.Server
		}
	}
	require.NotNil(t, lostReplica, "the lost primary's replica")
	lostReplica.Kill()
	lost.Kill()

	redistest.WaitFor(t, "CLUSTERDOWN answers to open the survivor's breaker", func() bool {
		_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
		return errors.Is(err, breaker.ErrOpen)
	})
	state := func() breaker.State {
		for _, b := range c.Breakers() {
			if b.Node == survivor.Addr {
				return b.State
			}
		}
		return breaker.Closed
	}
	// About twenty probes: none closes it (with no check sent meanwhile,
	// a breaker closed by a probe would stay closed).
	for end := time.Now().Add(20 * cooldown); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		require.NotEqual(t, breaker.Closed, state(), "a probe closed the survivor's breaker while the cluster is down")
	}
	assert.True(t, c.Degraded())

	lost.Start(t)
	lostReplica.Start(t)
	redistest.WaitFor(t, "the survivor's keys to be decided again", func() bool {
		_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
		return err == nil
	})
	assert.Equal(t, breaker.Closed, state())
}

// busyLoad is callers taking from a Store, each on keys of its own, with
// counts of what their calls met.
type busyLoad struct {
	ok, timeouts, refused, others atomic.Int64
	firstOther                    atomic.Pointer[error]
	stop                          context.CancelFunc
	wg                            sync.WaitGroup
}

// startBusyLoad starts n callers taking from rs until stopped.
func startBusyLoad(rs *redisx.Store, n int) *busyLoad {
	ctx, stop := context.WithCancel(context.Background())
	l := &busyLoad{stop: stop}
	p := algo.Params{Limit: 1_000_000, Period: time.Hour}
	for g := range n {
		l.wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				_, err := rs.Take(context.Background(), fmt.Appendf(nil, "busy-%d-%d", g, i%1000), p, 1, time.Now(), false)
				switch {
				case err == nil:
					l.ok.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					l.timeouts.Add(1)
				case errors.Is(err, breaker.ErrOpen):
					l.refused.Add(1)
				default:
					l.others.Add(1)
					l.firstOther.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	return l
}

// waitOK polls until n more calls succeeded.
func (l *busyLoad) waitOK(t *testing.T, n int64) {
	t.Helper()
	from := l.ok.Load()
	redistest.WaitFor(t, "successful calls", func() bool { return l.ok.Load() >= from+n })
}

// finish stops the callers and waits for them.
func (l *busyLoad) finish(t *testing.T) {
	t.Helper()
	l.stop()
	l.wg.Wait()
	if e := l.firstOther.Load(); e != nil {
		t.Errorf("%d calls failed otherwise than by a timeout or the breaker, first: %v", l.others.Load(), *e)
	}
}

// TestBreakerBusyRedis: a healthy Redis that is now and then busy for
// longer than the calls' timeout (a script spinning 300 ms, 10 times) under
// 8 callers with the default breaker: the calls in flight during a stall
// time out, the rest succeed, and the breaker stays closed, so the
// callers meet no more failures than Redis's timeouts. Then Redis is
// paused (SIGSTOP) under the same load, and the breaker opens within
// about its window.
func TestBreakerBusyRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	// The timeout is long enough that this loaded machine's own stalls
	// rarely outlast it (with store.timeout's default, 5 ms, they do).
	const timeout, stall = 100 * time.Millisecond, 300 * time.Millisecond
	c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}, Timeout: timeout})
	rs := redisx.NewStore(c)
	opened := `rld_redis_breaker_transitions_total{node="` + srv.Addr + `",to="open"}`

	l := startBusyLoad(rs, 8)
	l.waitOK(t, 500)
	for range 10 {
		srv.Busy(t, stall)
		l.waitOK(t, 300)
	}
	l.finish(t)
	ok, timeouts, refused := l.ok.Load(), l.timeouts.Load(), l.refused.Load()
	t.Logf("stalls of %v, timeout %v: %d calls ok, %d timed out, %d refused by the breaker", stall, timeout, ok, timeouts, refused)
	assert.Positive(t, timeouts, "the stalls time calls out")
	assert.Zero(t, refused, "no call refused: the failures are the timeouts only")
	assert.Zero(t, metricValue(t, opened), "the breaker never opened")
	assert.False(t, c.Degraded())

	l = startBusyLoad(rs, 8)
	defer l.finish(t)
	l.waitOK(t, 500)
	paused := time.Now()
	srv.Pause()
	defer srv.Resume()
	redistest.WaitFor(t, "the breaker to open", c.Degraded)
	took := time.Since(paused)
	t.Logf("paused: the breaker opened after %v (window %v)", took.Round(time.Millisecond), breaker.DefaultWindow)
	assert.Equal(t, float64(1), metricValue(t, opened))
	assert.Less(t, took, breaker.DefaultWindow+time.Second, "within about the window")
}
