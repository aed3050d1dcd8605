package breaker

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
)

// metric starts the names of the test breakers' metrics: rld's own, so
// that the tests check the names the dashboards and alerts use.
const metric = "rld_redis_breaker"

// breakerName returns a name no other test uses, so that its metrics are
// its own.
func breakerName(t *testing.T) string {
	return fmt.Sprintf("%s-%d", t.Name(), rand.Uint64())
}

// allow calls b.Allow and requires it to allow.
func allow(t *testing.T, b *Breaker, now time.Time) Ticket {
	t.Helper()
	tk, err := b.Allow(now)
	require.NoError(t, err, "Allow at %s", now.Sub(t0))
	return tk
}

// refused calls b.Allow and requires a refusal with retryAt.
func refused(t *testing.T, b *Breaker, now, retryAt time.Time) {
	t.Helper()
	_, err := b.Allow(now)
	require.ErrorIs(t, err, ErrOpen, "Allow at %s", now.Sub(t0))
	var oe *OpenError
	require.ErrorAs(t, err, &oe)
	assert.Equal(t, b.Name(), oe.Name)
	assert.Equal(t, retryAt, oe.RetryAt, "RetryAt in the error, at %s", now.Sub(t0))
	assert.Contains(t, err.Error(), b.Name())
}

// fail records n failed calls at now.
func fail(t *testing.T, b *Breaker, now time.Time, n int) {
	t.Helper()
	for range n {
		b.Done(allow(t, b, now), now, true)
	}
}

func TestBreakerTransitions(t *testing.T) {
	o := Options{Failures: 3, Window: time.Second, Cooldown: 250 * time.Millisecond, Probes: 1, Successes: 2}
	b := New(metric, breakerName(t), o)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	assert.Equal(t, Closed, b.State())
	assert.True(t, b.RetryAt().IsZero())

	// Closed, with fewer than MinCalls calls in the window: a success
	// ends a run of failures; 3 failures in a row open it.
	fail(t, b, ms(0), 1)
	b.Done(allow(t, b, ms(10)), ms(10), false)
	fail(t, b, ms(100), 2)
	b.Done(allow(t, b, ms(200)), ms(200), false)
	assert.Equal(t, Closed, b.State(), "2 failures in a row")
	fail(t, b, ms(300), 2)
	assert.Equal(t, Closed, b.State(), "2 failures in a row")
	inFlight := allow(t, b, ms(900)) // a call that ends after the opening
	fail(t, b, ms(999), 1)
	assert.Equal(t, Open, b.State(), "3 failures in a row")
	retryAt := ms(999 + 250)
	assert.Equal(t, retryAt, b.RetryAt())

	// Open: nothing goes until the cool-down has passed; the result of a
	// call allowed before the opening changes nothing.
	b.Done(inFlight, ms(1000), true)
	refused(t, b, ms(1000), retryAt)
	refused(t, b, retryAt.Add(-time.Nanosecond), retryAt)
	assert.Equal(t, Open, b.State())

	// Half-open: one probe at a time; a failed probe opens it again.
	probe := allow(t, b, retryAt)
	assert.Equal(t, HalfOpen, b.State())
	refused(t, b, retryAt, retryAt) // the probe limit
	b.Done(probe, ms(1300), true)
	assert.Equal(t, Open, b.State(), "a failed probe")
	retryAt = ms(1300 + 250)
	assert.Equal(t, retryAt, b.RetryAt())
	refused(t, b, ms(1400), retryAt)

	// Two successful probes in a row close it; a call the node answered
	// with an error of the caller's making is a success.
	probe = allow(t, b, ms(1600))
	b.Done(probe, ms(1601), false)
	assert.Equal(t, HalfOpen, b.State(), "1 success of 2")
	assert.Equal(t, retryAt, b.RetryAt(), "in the past while half-open")
	b.Done(probe, ms(1601), false) // a second Done of one ticket is a caller bug; it must not count
	assert.Equal(t, HalfOpen, b.State())
	probe = allow(t, b, ms(1602))
	b.Done(probe, ms(1603), false) // an error of the caller's making: a success
	assert.Equal(t, Closed, b.State(), "2 successes")
	assert.True(t, b.RetryAt().IsZero())

	// Closed again, with a clean slate: the failures before the opening do
	// not count, nor does a late probe result or the zero ticket.
	b.Done(probe, ms(1604), true)
	b.Done(Ticket{}, ms(1604), true)
	fail(t, b, ms(1605), 2)
	assert.Equal(t, Closed, b.State())
	fail(t, b, ms(1706), 1)
	assert.Equal(t, Open, b.State())
}

// calls records, at now, successes successful calls and failures failed
// ones, spread evenly: no prefix of them has a larger share of failures
// than the whole, nor two failures in a row while there are more
// successes.
func calls(t *testing.T, b *Breaker, now time.Time, successes, failures int) {
	t.Helper()
	total, failed := successes+failures, 0
	for i := range total {
		f := (i+1)*failures/total > failed
		if f {
			failed++
		}
		b.Done(allow(t, b, now), now, f)
	}
}

// TestBreakerBusyNode: a node that answers most of many calls keeps its
// breaker closed, however many of its failures come in a row (a stall
// that times out every call in flight at once), so that the callers see
// no more failures than the node's own.
func TestBreakerBusyNode(t *testing.T) {
	b := New(metric, breakerName(t), Options{})
	refusals, failures := 0, 0
	for ms := 1; ms <= 10_000; ms++ { // 10 s at 20 calls a millisecond
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		stall := ms%50 == 0 // every 50 ms, 64 calls in a row time out
		for i := range 20 + 44*btoi(stall) {
			tk, err := b.Allow(now)
			if err != nil {
				refusals++
				continue
			}
			failed := stall || i == 0 && ms%7 == 0
			failures += btoi(failed)
			b.Done(tk, now, failed)
		}
	}
	t.Logf("%d failures, %d refusals", failures, refusals)
	assert.Greater(t, failures, 12_000)
	assert.Zero(t, refusals, "no call refused")
	assert.Equal(t, Closed, b.State())
}

// btoi returns 1 for true, 0 for false.
func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}

// TestBreakerRate: with at least MinCalls calls in the window, it opens
// at the call that brings the failed share to FailureRate, and not before.
func TestBreakerRate(t *testing.T) {
	b := New(metric, breakerName(t), Options{FailureRate: 50, MinCalls: 20, Window: time.Second})
	calls(t, b, t0, 60, 40)
	assert.Equal(t, Closed, b.State(), "40 of 100")
	fail(t, b, t0.Add(500*time.Millisecond), 19)
	assert.Equal(t, Closed, b.State(), "59 of 119")
	fail(t, b, t0.Add(500*time.Millisecond), 1)
	assert.Equal(t, Open, b.State(), "60 of 120")

	// Below MinCalls, a share of failures does not open it.
	b = New(metric, breakerName(t), Options{FailureRate: 50, MinCalls: 20, Failures: 5})
	calls(t, b, t0, 9, 10)
	assert.Equal(t, Closed, b.State(), "10 of 19, never 2 in a row")
	fail(t, b, t0.Add(100*time.Millisecond), 1)
	assert.Equal(t, Open, b.State(), "11 of 20")
}

// trip opens b, whose Failures is 1, at now: a failure in the bucket
// before now's, then one at now.
func trip(t *testing.T, b *Breaker, now time.Time) {
	t.Helper()
	fail(t, b, now.Add(-b.o.Window/numBuckets), 1)
	require.Equal(t, Closed, b.State(), "one failure")
	fail(t, b, now, 1)
	require.Equal(t, Open, b.State())
}

// TestBreakerBurst: failures in one bucket alone, however many (the calls
// in flight when the caller or the node stalled, all timing out at
// once), do not open it; one more failure in another bucket does.
func TestBreakerBurst(t *testing.T) {
	b := New(metric, breakerName(t), Options{})
	fail(t, b, t0, 100)
	assert.Equal(t, Closed, b.State(), "100 failures in a row at one time")
	fail(t, b, t0.Add(100*time.Millisecond), 1)
	assert.Equal(t, Open, b.State(), "101 of 101, in two buckets")
}

// TestBreakerWindow: the window rolls over buckets of a tenth of it: the
// calls of a bucket count until the window has moved on by ten buckets.
func TestBreakerWindow(t *testing.T) {
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, tc := range []struct {
		later time.Duration
		want  State
	}{
		{800 * time.Millisecond, Closed}, // 70 failed of 240
		{time.Second, Open},              // 20 failed of 40: the first bucket is out
	} {
		b := New(metric, breakerName(t), Options{FailureRate: 50, MinCalls: 20, Window: time.Second})
		calls(t, b, at(0), 150, 50)
		calls(t, b, at(tc.later), 20, 0)
		fail(t, b, at(tc.later), 10)
		fail(t, b, at(tc.later+100*time.Millisecond), 10)
		assert.Equal(t, tc.want, b.State(), "after %v", tc.later)
	}

	// A result reported with a time a window older than one already
	// counted changes nothing.
	b := New(metric, breakerName(t), Options{FailureRate: 50, MinCalls: 20, Failures: 1000, Window: time.Second})
	calls(t, b, at(time.Second), 20, 0)
	calls(t, b, at(0), 0, 100)
	assert.Equal(t, Closed, b.State())
	c, f, _ := b.window(at(time.Second).UnixNano())
	assert.Equal(t, [2]int{20, 0}, [2]int{c, f})
}

// TestBreakerAllocs: neither Allow nor Done allocates while closed,
// whether the call succeeded or failed.
func TestBreakerAllocs(t *testing.T) {
	b := New(metric, breakerName(t), Options{})
	n := 0
	allocs := testing.AllocsPerRun(1000, func() {
		n++
		now := t0.Add(time.Duration(n) * time.Millisecond)
		tk, _ := b.Allow(now)
		b.Done(tk, now, n%10 == 0)
	})
	assert.Zero(t, allocs)
	assert.Equal(t, Closed, b.State())
}

func TestBreakerDefaults(t *testing.T) {
	b := New(metric, breakerName(t), Options{})
	assert.Equal(t, Options{Window: time.Second, FailureRate: 50, MinCalls: 20, Failures: 5,
		Cooldown: 250 * time.Millisecond, Probes: 1, Successes: 2}, b.o)
	assert.Equal(t, 100, Options{FailureRate: 150}.WithDefaults().FailureRate)
	fail(t, b, t0, 4)
	assert.Equal(t, Closed, b.State())
	fail(t, b, t0.Add(999*time.Millisecond), 1)
	assert.Equal(t, Open, b.State())
	assert.Equal(t, t0.Add(999*time.Millisecond+250*time.Millisecond), b.RetryAt())

	assert.Equal(t, "closed", Closed.String())
	assert.Equal(t, "open", Open.String())
	assert.Equal(t, "half-open", HalfOpen.String())
	assert.Equal(t, "State(7)", State(7).String())
}

// TestBreakerProbeLimit: while half-open, exactly Probes calls are in
// flight at most, also when many goroutines ask at once; an ended probe
// frees its place.
func TestBreakerProbeLimit(t *testing.T) {
	const probes = 3
	b := New(metric, breakerName(t), Options{Failures: 1, Cooldown: time.Second, Probes: probes, Successes: 5})
	trip(t, b, t0)
	half := t0.Add(time.Second)

	var allowed atomic.Int32
	tickets := make(chan Ticket, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if tk, err := b.Allow(half); err == nil {
				allowed.Add(1)
				tickets <- tk
			} else {
				assert.ErrorIs(t, err, ErrOpen)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, probes, allowed.Load())
	assert.Equal(t, HalfOpen, b.State())

	b.Done(<-tickets, half, false)
	tk := allow(t, b, half) // the freed place
	refused(t, b, half, half)
	for _, tk := range []Ticket{tk, <-tickets, <-tickets} {
		b.Done(tk, half, false)
	}
	assert.Equal(t, HalfOpen, b.State(), "4 successes of 5")
	b.Done(allow(t, b, half), half, false)
	assert.Equal(t, Closed, b.State())
}

// TestBreakerConcurrent hammers one breaker from many goroutines with a
// shared clock and failures (random ones, and spans of nothing but
// failures), and checks the invariants: never more
// than Probes probes of one half-open state in flight (a late probe of an
// earlier one is not counted by the breaker), every refusal wraps ErrOpen with a
// RetryAt, and the transitions counted add up to the final state.
func TestBreakerConcurrent(t *testing.T) {
	const probes = 2
	name := breakerName(t)
	b := New(metric, name, Options{Failures: 3, Window: 10 * time.Millisecond,
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
					var oe *OpenError
					if !errors.As(err, &oe) || oe.RetryAt.IsZero() {
						t.Errorf("refusal %v", err)
						return
					}
					continue
				}
				calls.Add(1)
				probe := State(tk.word&stateMask) == HalfOpen
				if probe {
					mu.Lock()
					inFlight[tk.word]++
					maxInFlight = max(maxInFlight, inFlight[tk.word])
					mu.Unlock()
				}
				// Every third span of 4 ms, every call fails.
				failed := r.IntN(8) == 0 || now.Sub(t0)/(4*time.Millisecond)%3 == 0
				if probe {
					runtime.Gosched() // let others ask while the probe is out
					mu.Lock()
					inFlight[tk.word]--
					mu.Unlock()
				}
				b.Done(tk, t0.Add(time.Duration(clock.Load())), failed)
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
	if b.State() == Open {
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
	b := New(metric, name, Options{Failures: 1, Cooldown: time.Second, Successes: 1})
	esc := strings.ReplaceAll(name, `"`, `\"`)
	expose := func() string {
		var buf bytes.Buffer
		metrics.WritePrometheus(&buf, false)
		return buf.String()
	}
	check := func(state State, open, half, closed int) {
		t.Helper()
		out := expose()
		assert.Contains(t, out, fmt.Sprintf(`rld_redis_breaker_state{node="%s"} %d`+"\n", esc, state))
		for to, n := range map[string]int{"open": open, "half_open": half, "closed": closed} {
			assert.Contains(t, out, fmt.Sprintf(`rld_redis_breaker_transitions_total{node="%s",to="%s"} %d`+"\n", esc, to, n))
		}
	}
	check(Closed, 0, 0, 0)
	trip(t, b, t0)
	check(Open, 1, 0, 0)
	probe := allow(t, b, t0.Add(time.Second))
	check(HalfOpen, 1, 1, 0)
	b.Done(probe, t0.Add(time.Second), false)
	check(Closed, 1, 1, 1)
}

// BenchmarkBreaker measures Allow plus Done of a successful call on a
// closed breaker (the hot path), from one goroutine and from all, also
// with the clock read redisx makes for Done; of a failed call on a
// closed breaker; and Allow on an open one (every check while Redis is
// down).
func BenchmarkBreaker(b *testing.B) {
	b.Run("closed", func(b *testing.B) {
		br := New(metric, "bench-closed", Options{})
		b.ReportAllocs()
		for b.Loop() {
			tk, err := br.Allow(t0)
			br.Done(tk, t0, err != nil)
		}
	})
	b.Run("closed-parallel", func(b *testing.B) {
		br := New(metric, "bench-closed-parallel", Options{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tk, err := br.Allow(t0)
				br.Done(tk, t0, err != nil)
			}
		})
	})
	b.Run("closed-clock", func(b *testing.B) { // as redisx calls it: the time read at the end of each call
		br := New(metric, "bench-closed-clock", Options{})
		b.ReportAllocs()
		for b.Loop() {
			tk, err := br.Allow(t0)
			br.Done(tk, time.Now(), err != nil)
		}
	})
	b.Run("closed-clock-parallel", func(b *testing.B) {
		br := New(metric, "bench-closed-clock-parallel", Options{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tk, err := br.Allow(t0)
				br.Done(tk, time.Now(), err != nil)
			}
		})
	})
	b.Run("closed-failing", func(b *testing.B) { // failures spread too thin to open it
		br := New(metric, "bench-closed-failing", Options{Failures: math.MaxInt32, Window: time.Nanosecond})
		b.ReportAllocs()
		now := t0
		for b.Loop() {
			now = now.Add(time.Microsecond)
			tk, _ := br.Allow(now)
			br.Done(tk, now, true)
		}
	})
	b.Run("open-parallel", func(b *testing.B) {
		br := New(metric, "bench-open", Options{Failures: 1, Cooldown: time.Hour})
		for _, at := range []time.Time{t0.Add(-time.Second / 10), t0} {
			tk, _ := br.Allow(at)
			br.Done(tk, at, true)
		}
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
