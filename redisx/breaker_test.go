package redisx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/redistest"
)

var (
	t0         = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	errTimeout = fmt.Errorf("redisx: take %q: %w", "k", context.DeadlineExceeded) // a failure
	errApp     = errors.New("script replied 3 integers, want 5")                  // not one
)

// breakerName returns a name no other test uses, so that its metrics are
// its own.
func breakerName(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
}

// allow calls b.Allow and requires it to allow.
func allow(t *testing.T, b *Breaker, now time.Time) BreakerTicket {
	t.Helper()
	tk, err := b.Allow(now)
	require.NoError(t, err, "Allow at %s", now.Sub(t0))
	return tk
}

// refused calls b.Allow and requires a refusal with retryAt.
func refused(t *testing.T, b *Breaker, now, retryAt time.Time) {
	t.Helper()
	_, err := b.Allow(now)
	require.ErrorIs(t, err, ErrBreakerOpen, "Allow at %s", now.Sub(t0))
	var oe *BreakerOpenError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, b.Name(), oe.Name)
	assert.Equal(t, retryAt, oe.RetryAt, "RetryAt in the error, at %s", now.Sub(t0))
	assert.Contains(t, err.Error(), b.Name())
}

// fail records n failed calls at now.
func fail(t *testing.T, b *Breaker, now time.Time, n int) {
	t.Helper()
	for range n {
		b.Done(allow(t, b, now), now, errTimeout)
	}
}

func TestBreakerTransitions(t *testing.T) {
	o := BreakerOptions{Failures: 3, Window: time.Second, Cooldown: 250 * time.Millisecond, Probes: 1, Successes: 2}
	b := NewBreaker(breakerName(t), o)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	assert.Equal(t, BreakerClosed, b.State())
	assert.True(t, b.RetryAt().IsZero())

	// Closed: successes and non-failures in between do not erase
	// failures; 3 within 1 s open it.
	fail(t, b, ms(0), 1)
	b.Done(allow(t, b, ms(10)), ms(10), nil)
	b.Done(allow(t, b, ms(20)), ms(20), errApp)
	fail(t, b, ms(100), 1)
	b.Done(allow(t, b, ms(200)), ms(200), nil)
	assert.Equal(t, BreakerClosed, b.State(), "2 failures")
	inFlight := allow(t, b, ms(900)) // a call that ends after the opening
	fail(t, b, ms(999), 1)
	assert.Equal(t, BreakerOpen, b.State(), "3 failures within 1 s")
	retryAt := ms(999 + 250)
	assert.Equal(t, retryAt, b.RetryAt())

	// Open: nothing goes until the cool-down has passed; the result of a
	// call allowed before the opening changes nothing.
	b.Done(inFlight, ms(1000), errTimeout)
	refused(t, b, ms(1000), retryAt)
	refused(t, b, retryAt.Add(-time.Nanosecond), retryAt)
	assert.Equal(t, BreakerOpen, b.State())

	// Half-open: one probe at a time; a failed probe opens it again.
	probe := allow(t, b, retryAt)
	assert.Equal(t, BreakerHalfOpen, b.State())
	refused(t, b, retryAt, retryAt) // the probe limit
	b.Done(probe, ms(1300), errTimeout)
	assert.Equal(t, BreakerOpen, b.State(), "a failed probe")
	retryAt = ms(1300 + 250)
	assert.Equal(t, retryAt, b.RetryAt())
	refused(t, b, ms(1400), retryAt)

	// Two successful probes in a row close it; an application error is a
	// success (Redis answered).
	probe = allow(t, b, ms(1600))
	b.Done(probe, ms(1601), nil)
	assert.Equal(t, BreakerHalfOpen, b.State(), "1 success of 2")
	assert.Equal(t, retryAt, b.RetryAt(), "in the past while half-open")
	b.Done(probe, ms(1601), nil) // a second Done of one ticket is a caller bug; it must not count
	assert.Equal(t, BreakerHalfOpen, b.State())
	probe = allow(t, b, ms(1602))
	b.Done(probe, ms(1603), errApp)
	assert.Equal(t, BreakerClosed, b.State(), "2 successes")
	assert.True(t, b.RetryAt().IsZero())

	// Closed again, with a clean slate: the failures before the opening do
	// not count, nor does a late probe result or the zero ticket.
	b.Done(probe, ms(1604), errTimeout)
	b.Done(BreakerTicket{}, ms(1604), errTimeout)
	fail(t, b, ms(1605), 2)
	assert.Equal(t, BreakerClosed, b.State())
	fail(t, b, ms(1606), 1)
	assert.Equal(t, BreakerOpen, b.State())
}

// TestBreakerWindow: the window slides over the failures' times, so 3
// failures spread over more than 1 s never open it, however many.
func TestBreakerWindow(t *testing.T) {
	b := NewBreaker(breakerName(t), BreakerOptions{Failures: 3, Window: time.Second})
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for i := range 20 { // one failure every 501 ms: at most 2 in any 1 s
		fail(t, b, at(time.Duration(i)*501*time.Millisecond), 1)
		require.Equal(t, BreakerClosed, b.State(), "failure %d", i)
	}
	// The failures at 9018 and 9519 ms and one more at 10000 ms are 3
	// within 1 s (982 ms).
	fail(t, b, at(10*time.Second), 1)
	assert.Equal(t, BreakerOpen, b.State())

	// A failure exactly Window after the first of them is outside.
	b = NewBreaker(breakerName(t), BreakerOptions{Failures: 2, Window: time.Second})
	fail(t, b, at(0), 1)
	fail(t, b, at(time.Second), 1)
	assert.Equal(t, BreakerClosed, b.State(), "2 failures exactly 1 s apart")
	fail(t, b, at(time.Second+time.Millisecond), 1)
	assert.Equal(t, BreakerOpen, b.State())
}

func TestBreakerDefaults(t *testing.T) {
	b := NewBreaker(breakerName(t), BreakerOptions{})
	assert.Equal(t, BreakerOptions{Failures: 5, Window: time.Second, Cooldown: 250 * time.Millisecond, Probes: 1, Successes: 2}, b.o)
	fail(t, b, t0, 4)
	assert.Equal(t, BreakerClosed, b.State())
	fail(t, b, t0.Add(999*time.Millisecond), 1)
	assert.Equal(t, BreakerOpen, b.State())
	assert.Equal(t, t0.Add(999*time.Millisecond+250*time.Millisecond), b.RetryAt())

	assert.Equal(t, "closed", BreakerClosed.String())
	assert.Equal(t, "open", BreakerOpen.String())
	assert.Equal(t, "half-open", BreakerHalfOpen.String())
	assert.Equal(t, "BreakerState(7)", BreakerState(7).String())
}

// TestBreakerProbeLimit: while half-open, exactly Probes calls are in
// flight at most, also when many goroutines ask at once; an ended probe
// frees its place.
func TestBreakerProbeLimit(t *testing.T) {
	const probes = 3
	b := NewBreaker(breakerName(t), BreakerOptions{Failures: 1, Cooldown: time.Second, Probes: probes, Successes: 5})
	fail(t, b, t0, 1)
	half := t0.Add(time.Second)

	var allowed atomic.Int32
	tickets := make(chan BreakerTicket, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if tk, err := b.Allow(half); err == nil {
				allowed.Add(1)
				tickets <- tk
			} else {
				assert.ErrorIs(t, err, ErrBreakerOpen)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, probes, allowed.Load())
	assert.Equal(t, BreakerHalfOpen, b.State())

	b.Done(<-tickets, half, nil)
	tk := allow(t, b, half) // the freed place
	refused(t, b, half, half)
	for _, tk := range []BreakerTicket{tk, <-tickets, <-tickets} {
		b.Done(tk, half, nil)
	}
	assert.Equal(t, BreakerHalfOpen, b.State(), "4 successes of 5")
	b.Done(allow(t, b, half), half, nil)
	assert.Equal(t, BreakerClosed, b.State())
}

// TestBreakerConcurrent hammers one breaker from many goroutines with a
// shared clock and random failures, and checks the invariants: never more
// than Probes probes of one half-open state in flight (a late probe of an
// earlier one is not counted by the breaker), every refusal wraps ErrBreakerOpen with a
// RetryAt, and the transitions counted add up to the final state.
func TestBreakerConcurrent(t *testing.T) {
	const probes = 2
	name := breakerName(t)
	b := NewBreaker(name, BreakerOptions{Failures: 3, Window: 10 * time.Millisecond,
		Cooldown: time.Millisecond, Probes: probes, Successes: 2})
	var clock atomic.Int64 // ns since t0
	var calls, refusals atomic.Int64
	var mu sync.Mutex
	inFlight := map[uint64]int{} // probes in flight by half-open state
	maxInFlight := 0
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 5000 {
				now := t0.Add(time.Duration(clock.Add(int64(r.IntN(20_000)))))
				tk, err := b.Allow(now)
				if err != nil {
					refusals.Add(1)
					var oe *BreakerOpenError
					if !errors.As(err, &oe) || oe.RetryAt.IsZero() {
						t.Errorf("refusal %v", err)
						return
					}
					continue
				}
				calls.Add(1)
				probe := BreakerState(tk.word&stateMask) == BreakerHalfOpen
				if probe {
					mu.Lock()
					inFlight[tk.word]++
					maxInFlight = max(maxInFlight, inFlight[tk.word])
					mu.Unlock()
				}
				var res error
				if r.IntN(8) == 0 {
					res = errTimeout
				}
				if probe {
					runtime.Gosched() // let others ask while the probe is out
					mu.Lock()
					inFlight[tk.word]--
					mu.Unlock()
				}
				b.Done(tk, t0.Add(time.Duration(clock.Load())), res)
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls, %d refused, at most %d probes in flight; ended %s", calls.Load(), refusals.Load(), maxInFlight, b.State())
	assert.LessOrEqual(t, maxInFlight, probes)
	assert.Positive(t, refusals.Load())

	// Every opening is followed by one half-open state, but the last
	// opening when the breaker ends open.
	toOpen, toHalf := counterValue(t, name, "open"), counterValue(t, name, "half_open")
	if b.State() == BreakerOpen {
		toHalf++
	}
	assert.Equal(t, toOpen, toHalf)
	assert.Positive(t, counterValue(t, name, "closed"), "it closed again at least once")
	assert.Equal(t, float64(b.State()), metrics.GetOrCreateGauge(`rld_redis_breaker_state{node="`+name+`"}`, nil).Get())
}

// counterValue returns rld_redis_breaker_transitions_total of breaker
// name to state to.
func counterValue(t *testing.T, name, to string) uint64 {
	t.Helper()
	return metrics.GetOrCreateCounter(`rld_redis_breaker_transitions_total{node="` + name + `",to="` + to + `"}`).Get()
}

func TestBreakerMetrics(t *testing.T) {
	name := breakerName(t) + `-"quoted"`
	b := NewBreaker(name, BreakerOptions{Failures: 1, Cooldown: time.Second, Successes: 1})
	esc := strings.ReplaceAll(name, `"`, `\"`)
	expose := func() string {
		var buf bytes.Buffer
		metrics.WritePrometheus(&buf, false)
		return buf.String()
	}
	check := func(state BreakerState, open, half, closed int) {
		t.Helper()
		out := expose()
		assert.Contains(t, out, fmt.Sprintf(`rld_redis_breaker_state{node="%s"} %d`+"\n", esc, state))
		for to, n := range map[string]int{"open": open, "half_open": half, "closed": closed} {
			assert.Contains(t, out, fmt.Sprintf(`rld_redis_breaker_transitions_total{node="%s",to="%s"} %d`+"\n", esc, to, n))
		}
	}
	check(BreakerClosed, 0, 0, 0)
	fail(t, b, t0, 1)
	check(BreakerOpen, 1, 0, 0)
	probe := allow(t, b, t0.Add(time.Second))
	check(BreakerHalfOpen, 1, 1, 0)
	b.Done(probe, t0.Add(time.Second), nil)
	check(BreakerClosed, 1, 1, 1)
}

// TestBreakerIsFailure classifies errors provoked from real Redis servers.
func TestBreakerIsFailure(t *testing.T) {
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

	t.Run("answers of a healthy redis", func(t *testing.T) {
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
	})

	t.Run("unavailable replies", func(t *testing.T) {
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
	})

	t.Run("no connection", func(t *testing.T) {
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
	})

	t.Run("timeout", func(t *testing.T) {
		p := redistest.StartProxy(t, srv.Addr)
		pc := newRueidis(t, p.Addr())
		require.NoError(t, pc.Do(ctx, pc.B().Ping().Build()).Error())
		p.Blackhole()
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		err := pc.Do(cctx, pc.B().Ping().Build()).Error()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.True(t, isFailure(err), "%v", err)
		p.Heal() // or closing the client waits for the held PING
	})

	t.Run("connection reset", func(t *testing.T) {
		p := redistest.StartProxy(t, srv.Addr)
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
			info, err := redistest.Do(srv.Addr, "INFO", "clients")
			return err == nil && strings.Contains(info, "blocked_clients:1")
		})
		p.Drop()
		err := <-errc
		require.Error(t, err)
		t.Logf("a reset connection: %T: %v", err, err)
		assert.False(t, isTimeout(err), "the reset, not a deadline: %v", err)
		assert.True(t, isFailure(err), "%T %v", err, err)
	})
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

// BenchmarkBreaker measures Allow plus Done of a successful call on a
// closed breaker (the hot path), from one goroutine and from all, and
// Allow on an open one (every check while Redis is down).
func BenchmarkBreaker(b *testing.B) {
	b.Run("closed", func(b *testing.B) {
		br := NewBreaker("bench-closed", BreakerOptions{})
		b.ReportAllocs()
		for b.Loop() {
			tk, err := br.Allow(t0)
			br.Done(tk, t0, err)
		}
	})
	b.Run("closed-parallel", func(b *testing.B) {
		br := NewBreaker("bench-closed-parallel", BreakerOptions{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tk, err := br.Allow(t0)
				br.Done(tk, t0, err)
			}
		})
	})
	b.Run("closed-failing", func(b *testing.B) { // failures spread too thin to open it
		br := NewBreaker("bench-closed-failing", BreakerOptions{Failures: 2, Window: time.Nanosecond})
		b.ReportAllocs()
		now := t0
		for b.Loop() {
			now = now.Add(time.Microsecond)
			tk, _ := br.Allow(now)
			br.Done(tk, now, errTimeout)
		}
	})
	b.Run("open-parallel", func(b *testing.B) {
		br := NewBreaker("bench-open", BreakerOptions{Failures: 1, Cooldown: time.Hour})
		tk, _ := br.Allow(t0)
		br.Done(tk, t0, errTimeout)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := br.Allow(t0); err == nil {
					panic("allowed")
				}
			}
		})
	})
}
