package daemon_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// The failure tests run a daemon whose Redis fails while clients keep
// checking, and count what the clients see.
const (
	// failTimeout is store.timeout of the failure tests' daemons.
	failTimeout = 20 * time.Millisecond
	// failSlack is added to failTimeout to bound an answer's latency, as
	// the client measures it: scheduler noise of a loaded two-core
	// machine running -race, not time spent on Redis.
	failSlack = 100 * time.Millisecond
	// recoveryBound is how soon after Redis is back the checks must be
	// decided by Redis again: the breaker's next probe, a reconnect and a
	// loaded host's scheduling.
	recoveryBound = 2 * time.Second
	// slowShare is the share of answers that may exceed the latency bound:
	// a loaded host stalls a client now and then. A daemon that waited on
	// the failed Redis would slow every answer of the outage, not a few.
	slowShare = 0.01
	// hangBound is the latency no answer may reach, stall or not.
	hangBound = time.Second
)

// failConfig returns rld.toml for a daemon on the Redis at addr with
// store.timeout timeout: rule "open" (cached, fail open) for alg=open,
// "strict-open" (strict, fail open) for alg=strict, "closed" (strict,
// fail closed) for alg=closed, each counting by api_key with a limit
// far above the tests' traffic, and "share" (cached, fail open, 300 an
// hour) for alg=share.
func failConfig(addr string, timeout time.Duration) string {
	return fmt.Sprintf(`[server]
max_connections = 1000

[store]
redis = [%q]
timeout = %q

[[rule]]
name = "open"
match = { alg = "open" }
by = ["api_key"]
limit = 1000000
period = "1s"
mode = "cached"
fail = "open"

[[rule]]
name = "strict-open"
match = { alg = "strict" }
by = ["api_key"]
limit = 1000000
period = "1s"
mode = "strict"
fail = "open"

[[rule]]
name = "closed"
match = { alg = "closed" }
by = ["api_key"]
limit = 1000000
period = "1s"
mode = "strict"
fail = "closed"

[[rule]]
name = "share"
match = { alg = "share" }
by = ["api_key"]
limit = 300
period = "1h"
mode = "cached"
fail = "open"

[[rule]]
name = "exact"
match = { alg = "exact" }
by = ["api_key"]
limit = 50
period = "1h"
mode = "strict"
fail = "open"
`, addr, timeout.String())
}

// answer is what one check got, and when.
type answer struct {
	sent, got time.Time
	status    wire.Status
	degraded  bool
	err       error
}

// failLoad is the record of clients checking through a daemon: every
// answer, and counts to poll.
type failLoad struct {
	mu      sync.Mutex
	answers []answer

	normal, degraded, errs atomic.Int64
	stop                   context.CancelFunc
	wg                     sync.WaitGroup
}

// startLoad starts n clients on socket, each checking its own api_key
// under alg about once a millisecond, until stopped.
func startLoad(socket, alg string, n int) *failLoad {
	ctx, stop := context.WithCancel(context.Background())
	l := &failLoad{stop: stop}
	for i := range n {
		c := client.New(socket)
		descs := []client.Descriptor{{Name: "api_key", Value: fmt.Sprintf("%s-%d", alg, i)}, {Name: "alg", Value: alg}}
		l.wg.Go(func() {
			defer c.Close()
			for ctx.Err() == nil {
				sent := time.Now()
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				r, err := c.Check(cctx, descs, 1)
				cancel()
				a := answer{sent: sent, got: time.Now(), status: r.Status, degraded: r.Degraded, err: err}
				switch {
				case err != nil || r.Status == wire.StatusError:
					l.errs.Add(1)
				case r.Degraded:
					l.degraded.Add(1)
				default:
					l.normal.Add(1)
				}
				l.mu.Lock()
				l.answers = append(l.answers, a)
				l.mu.Unlock()
				time.Sleep(time.Millisecond) // pacing, not synchronising
			}
		})
	}
	return l
}

// wait polls until count has grown by n.
func (l *failLoad) wait(t *testing.T, what string, count *atomic.Int64, n int64) {
	t.Helper()
	from := count.Load()
	redistest.WaitFor(t, what, func() bool { return count.Load() >= from+n })
}

// finish stops the clients and returns every answer.
func (l *failLoad) finish() []answer {
	l.stop()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers
}

// outage is what the answers of a run with one outage from down to up
// show.
type outage struct {
	answers, errs, slow int
	// degraded counts the degraded answers, normalDuring the normal
	// ones sent during the outage (from a lease the cache held).
	degraded, normalDuring int
	// recovery is from up to the last degraded answer (0 when none came
	// after up).
	recovery time.Duration
	// normalAfter counts the normal answers after the last degraded one.
	normalAfter int
	maxLatency  time.Duration
}

// analyse counts the answers of a run whose Redis failed from down to up,
// with bound the latency an answer must not exceed.
func analyse(t *testing.T, answers []answer, down, up time.Time, bound time.Duration) outage {
	t.Helper()
	var o outage
	var lastDegraded time.Time
	for _, a := range answers {
		o.answers++
		lat := a.got.Sub(a.sent)
		o.maxLatency = max(o.maxLatency, lat)
		if lat > bound {
			o.slow++
			if o.slow <= 5 {
				t.Logf("slow answer: %v, sent %v after the fault began", lat, a.sent.Sub(down))
			}
		}
		switch {
		case a.err != nil || a.status == wire.StatusError:
			o.errs++
			if o.errs <= 5 {
				t.Logf("error answer, sent %v after the fault began: %v %v", a.sent.Sub(down), a.status, a.err)
			}
		case a.degraded:
			o.degraded++
			if a.got.After(lastDegraded) {
				lastDegraded = a.got
			}
		case a.sent.After(down) && a.got.Before(up):
			o.normalDuring++
		}
	}
	if lastDegraded.After(up) {
		o.recovery = lastDegraded.Sub(up)
	}
	for _, a := range answers {
		if a.err == nil && !a.degraded && a.sent.After(lastDegraded) {
			o.normalAfter++
		}
	}
	return o
}

// check asserts the criteria of the issue on o: no error answer, at most
// slowShare of the answers slower than bound and none slower than
// hangBound, degraded answers during the outage, and normal decisions
// again within recoveryBound of Redis being back.
func (o outage) check(t *testing.T, what string, outageLen, bound time.Duration) {
	t.Helper()
	t.Logf("%s: %d answers over a %v outage: %d degraded, %d normal during it (leases), %d errors, %d slower than %v (max %v); recovery %v after redis was back, %d normal answers since",
		what, o.answers, outageLen.Round(time.Millisecond), o.degraded, o.normalDuring, o.errs, o.slow, bound, o.maxLatency.Round(time.Millisecond),
		o.recovery.Round(time.Millisecond), o.normalAfter)
	assert.Zero(t, o.errs, "%s: error answers", what)
	assert.LessOrEqual(t, float64(o.slow), slowShare*float64(o.answers), "%s: answers slower than %v", what, bound)
	assert.Less(t, o.maxLatency, hangBound, "%s: an answer took as long as a hang", what)
	assert.Positive(t, o.degraded, "%s: degraded answers during the outage", what)
	assert.Less(t, o.recovery, recoveryBound, "%s: still degraded after redis was back", what)
	assert.Positive(t, o.normalAfter, "%s: normal answers after the recovery", what)
}

// startFailDaemon starts a daemon on the Redis at addr, stopped when t
// ends.
func startFailDaemon(t *testing.T, addr string, timeout time.Duration) *daemontest.Server {
	t.Helper()
	d, err := daemontest.Start(failConfig(addr, timeout))
	require.NoError(t, err)
	t.Cleanup(d.Close)
	return d
}

// healthOf returns the daemon's /healthz.
func healthOf(t *testing.T, d *daemontest.Server) (int, daemon.Health) {
	t.Helper()
	resp, err := http.Get("http://" + d.HTTP + "/healthz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var h daemon.Health
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&h))
	return resp.StatusCode, h
}

// waitBreakerOpen polls d's /healthz until a breaker is open, then waits
// for n more degraded answers of l: the outage then spans refusals by the
// open breaker and failed probes, not just the first failed calls.
func waitBreakerOpen(t *testing.T, d *daemontest.Server, l *failLoad, n int64) {
	t.Helper()
	redistest.WaitFor(t, "/healthz to show a breaker open", func() bool {
		_, h := healthOf(t, d)
		return breakerOpen(h)
	})
	l.wait(t, "degraded answers with the breaker open", &l.degraded, n)
}

// breakerOpen reports whether h shows a breaker that is not closed.
func breakerOpen(h daemon.Health) bool {
	if h.Redis == nil {
		return false
	}
	for _, b := range h.Redis.Breakers {
		if b.State != "closed" {
			return true
		}
	}
	return false
}

// TestFailRedisKilled: Redis is SIGKILLed under steady load through
// cached and strict fail-open rules, then started again. No client sees
// an error or an answer slower than the deadline; answers are degraded
// during the outage, and decided by Redis again within a second of its
// return.
func TestFailRedisKilled(t *testing.T) {
	srv := redistest.Standalone(t)
	d := startFailDaemon(t, srv.Addr, failTimeout)
	for _, alg := range []string{"open", "strict"} {
		t.Run(alg, func(t *testing.T) {
			l := startLoad(d.Socket, alg, 8)
			l.wait(t, "normal answers before the kill", &l.normal, 300)
			down := time.Now()
			srv.Kill()
			waitBreakerOpen(t, d, l, 2000)
			srv.Start(t)
			up := time.Now()
			l.wait(t, "normal answers after the restart", &l.normal, 1000)
			o := analyse(t, l.finish(), down, up, failTimeout+failSlack)
			o.check(t, "killed", up.Sub(down), failTimeout+failSlack)
		})
	}
}

// TestFailRedisPaused: the same with Redis frozen (SIGSTOP), so that
// calls hang instead of failing: each waits for the timeout at most,
// then the breaker refuses them at once.
func TestFailRedisPaused(t *testing.T) {
	srv := redistest.Standalone(t)
	d := startFailDaemon(t, srv.Addr, failTimeout)
	l := startLoad(d.Socket, "open", 8)
	l.wait(t, "normal answers before the pause", &l.normal, 300)
	down := time.Now()
	srv.Pause()
	waitBreakerOpen(t, d, l, 2000)
	// Long enough for rueidis to give up on its connection (its write
	// timeout is 500 ms), so that the recovery dials again.
	redistest.WaitFor(t, "the pause to outlast rueidis's write timeout", func() bool { return time.Since(down) > 700*time.Millisecond })
	srv.Resume()
	up := time.Now()
	l.wait(t, "normal answers after the resume", &l.normal, 1000)
	o := analyse(t, l.finish(), down, up, failTimeout+failSlack)
	o.check(t, "paused", up.Sub(down), failTimeout+failSlack)
}

// TestFailRedisBlackholedOrSlow: the daemon reaches Redis through a
// fault proxy. A delay below the timeout keeps every answer normal and
// the strict limit exact; a blackhole and a delay above the timeout
// degrade the answers until the proxy heals, with no error and (but for
// a loaded host's stalls, slowShare) no slow answer.
func TestFailRedisBlackholedOrSlow(t *testing.T) {
	srv := redistest.Standalone(t)
	proxy := redistest.StartProxy(t, srv.Addr)
	const timeout = 60 * time.Millisecond
	d := startFailDaemon(t, proxy.Addr(), timeout)
	bound := timeout + failSlack

	// Slow but within the deadline: 5 ms each way. A check may wait for
	// two round trips (its key's call in flight, then its own), so that
	// leaves the scheduler 40 ms.
	l := startLoad(d.Socket, "open", 8)
	l.wait(t, "normal answers before the delay", &l.normal, 300)
	delayed := time.Now()
	proxy.Delay(5 * time.Millisecond)
	l.wait(t, "normal answers with a delay", &l.normal, 1000)
	c := client.New(d.Socket)
	defer c.Close()
	admitted, limited := 0, 0
	for range 80 {
		r, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "slow"}, {Name: "alg", Value: "exact"}}, 1)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%+v", r)
		if r.Allowed() {
			admitted++
		} else {
			limited++
		}
	}
	var answers []answer
	for _, a := range l.finish() {
		if a.sent.After(delayed) {
			answers = append(answers, a)
		}
	}
	o := analyse(t, answers, time.Now(), time.Now(), bound)
	t.Logf("delay 5ms each way, timeout %v: %d answers, %d degraded, %d errors, max latency %v; strict limit 50: %d admitted, %d limited",
		timeout, o.answers, o.degraded, o.errs, o.maxLatency.Round(time.Millisecond), admitted, limited)
	// A loaded host may stall a call past the timeout now and then; a
	// delay that the deadline did not cover would degrade them all.
	assert.LessOrEqual(t, float64(o.degraded), slowShare*float64(o.answers), "a delay below the timeout does not degrade")
	assert.Zero(t, o.errs)
	assert.LessOrEqual(t, float64(o.slow), slowShare*float64(o.answers), "answers slower than %v", bound)
	assert.Less(t, o.maxLatency, hangBound, "an answer took as long as a hang")
	assert.Equal(t, 50, admitted, "the strict limit holds exactly")
	proxy.Heal()

	for _, fault := range []struct {
		name  string
		apply func()
	}{
		{"blackholed", proxy.Blackhole},
		{"slowed beyond the timeout", func() { proxy.Delay(300 * time.Millisecond) }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			l := startLoad(d.Socket, "strict", 8)
			l.wait(t, "normal answers before the fault", &l.normal, 300)
			down := time.Now()
			fault.apply()
			waitBreakerOpen(t, d, l, 2000)
			proxy.Heal()
			up := time.Now()
			l.wait(t, "normal answers after healing", &l.normal, 1000)
			o := analyse(t, l.finish(), down, up, bound)
			o.check(t, fault.name, up.Sub(down), bound)
		})
	}
}

// TestFailFairShare: three daemons share a Redis that is killed; one
// fresh key hammered through all three is admitted about its limit in
// all (each daemon its third), not three times the limit.
func TestFailFairShare(t *testing.T) {
	srv := redistest.Standalone(t)
	var ds []*daemontest.Server
	for range 3 {
		ds = append(ds, startFailDaemon(t, srv.Addr, failTimeout))
	}
	for i, d := range ds {
		redistest.WaitFor(t, fmt.Sprintf("daemon %d to count 3 live daemons", i), func() bool {
			_, h := healthOf(t, d)
			return h.Redis != nil && h.Redis.Daemons == 3
		})
	}
	srv.Kill()

	const limit, perDaemon = 300, 600 // checks sent to each daemon: twice its share
	var admitted, limited, degraded, errs [3]atomic.Int64
	var wg sync.WaitGroup
	for i, d := range ds {
		for range 4 {
			c := client.New(d.Socket)
			defer c.Close()
			wg.Go(func() {
				for range perDaemon / 4 {
					r, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "hot"}, {Name: "alg", Value: "share"}}, 1)
					switch {
					case err != nil:
						errs[i].Add(1)
						continue
					case r.Allowed():
						admitted[i].Add(1)
					default:
						limited[i].Add(1)
					}
					if r.Degraded {
						degraded[i].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	total := int64(0)
	for i := range ds {
		t.Logf("daemon %d: %d admitted, %d limited, %d degraded, %d errors", i, admitted[i].Load(), limited[i].Load(), degraded[i].Load(), errs[i].Load())
		total += admitted[i].Load()
		assert.Zero(t, errs[i].Load())
		assert.Equal(t, int64(perDaemon), degraded[i].Load(), "every answer is degraded: the key was never in redis")
		assert.LessOrEqual(t, admitted[i].Load(), int64(limit/3), "daemon %d keeps to its share", i)
		assert.Positive(t, admitted[i].Load(), "daemon %d admits its share", i)
	}
	t.Logf("limit %d, 3 daemons: %d admitted during the outage in all", limit, total)
	assert.LessOrEqual(t, total, int64(limit), "the fleet keeps to the limit, not 3× it")
	assert.GreaterOrEqual(t, total, int64(limit*9/10), "about the limit")
}

// TestFailClosed: while Redis is down, a fail-closed rule denies with a
// retry-after (on the socket and over HTTP), a fail-open rule next to it
// allows degraded (a strict one at once, a cached one once its lease is
// used up), and /healthz says degraded with HTTP 200; the rules are
// normal again once Redis is back.
func TestFailClosed(t *testing.T) {
	srv := redistest.Standalone(t)
	d := startFailDaemon(t, srv.Addr, failTimeout)
	c := client.New(d.Socket)
	defer c.Close()
	check := func(alg string) client.Result {
		t.Helper()
		r, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "alg", Value: alg}}, 1)
		require.NoError(t, err)
		return r
	}
	// Before the kill every rule answers normally. With a timeout of
	// 20 ms a loaded machine can time out the daemon's first calls (the
	// scripts are loaded then), which a fail-closed rule denies: so the
	// normal answer is waited for.
	for _, alg := range []string{"closed", "strict", "open"} {
		redistest.WaitFor(t, alg+" to answer allowed, not degraded", func() bool {
			r := check(alg)
			return r.Status == wire.StatusAllowed && !r.Degraded
		})
	}
	// /healthz says degraded for a second after a fail mode decided a
	// check (those first calls, on a loaded machine): it turns ok then.
	var code int
	var h daemon.Health
	redistest.WaitFor(t, "/healthz to say ok", func() bool {
		code, h = healthOf(t, d)
		return h.Status == "ok"
	})
	require.Equal(t, http.StatusOK, code)
	require.NotNil(t, h.Redis)
	assert.Equal(t, []daemon.BreakerHealth{{Node: srv.Addr, State: "closed"}}, h.Redis.Breakers)

	srv.Kill()
	down := time.Now()
	var r client.Result
	redistest.WaitFor(t, "the breaker to open", func() bool {
		r = check("closed")
		_, h = healthOf(t, d)
		return breakerOpen(h)
	})
	assert.Equal(t, "degraded", h.Status)
	t.Logf("breaker open %v after the kill", time.Since(down).Round(time.Millisecond))
	r = check("closed")
	assert.Equal(t, wire.StatusLimited, r.Status, "%+v", r)
	assert.True(t, r.Degraded)
	assert.Equal(t, "closed", r.Rule)
	assert.Positive(t, r.RetryAfter, "a retry-after: until the breaker's next probe")
	assert.LessOrEqual(t, r.RetryAfter, 250*time.Millisecond, "at most the breaker's cool-down")
	t.Logf("fail closed: %s, retry after %v", r.Status, r.RetryAfter)
	r = check("strict")
	assert.Equal(t, wire.StatusAllowedDegraded, r.Status, "%+v", r)
	assert.True(t, r.Degraded)
	redistest.WaitFor(t, "the cached rule's lease to lapse", func() bool { return check("open").Degraded })
	r = check("open")
	assert.Equal(t, wire.StatusAllowedDegraded, r.Status, "%+v", r)

	code, h = healthOf(t, d)
	assert.Equal(t, http.StatusOK, code, "healthy but degraded")
	assert.Equal(t, "degraded", h.Status)
	require.Len(t, h.Redis.Breakers, 1)
	assert.Contains(t, []string{"open", "half-open"}, h.Redis.Breakers[0].State)
	t.Logf("/healthz while redis is down: %+v", *h.Redis)

	// Over HTTP: 429 with Retry-After for the closed rule, 200 for the
	// open one, both marked degraded.
	for alg, want := range map[string]int{"closed": http.StatusTooManyRequests, "strict": http.StatusOK} {
		resp, err := http.Get("http://" + d.HTTP + "/v1/check?api_key=k&alg=" + alg)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, want, resp.StatusCode, alg)
		assert.Equal(t, "degraded", resp.Header.Get("X-RateLimit-Policy"), alg)
		if want == http.StatusTooManyRequests {
			assert.Equal(t, "1", resp.Header.Get("Retry-After"), "rounded up to a second")
			assert.Equal(t, `"closed";r=0;t=1`, resp.Header.Get("RateLimit"), "t is the retry-after when degraded")
		} else {
			assert.NotContains(t, resp.Header.Get("RateLimit"), ";t=", "no effective window known on the share")
		}
	}

	srv.Start(t)
	up := time.Now()
	redistest.WaitFor(t, "the closed rule to allow again", func() bool {
		r := check("closed")
		return r.Status == wire.StatusAllowed && !r.Degraded
	})
	t.Logf("closed rule normal %v after redis was back", time.Since(up).Round(time.Millisecond))
	assert.Less(t, time.Since(up), recoveryBound)
	for _, alg := range []string{"strict", "open"} {
		r = check(alg)
		assert.Equal(t, wire.StatusAllowed, r.Status, alg)
		assert.False(t, r.Degraded, alg)
	}
	redistest.WaitFor(t, "/healthz to say ok", func() bool {
		_, h := healthOf(t, d)
		return h.Status == "ok"
	})
}
