package daemon_test

import (
	"context"
	"fmt"
	"strconv"
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
)

// cacheConfig is rld.toml for the hot-key cache tests: one cached rule
// per algorithm that leases (selected by alg), one strict token bucket,
// each counting by api_key with limit per period.
func cacheConfig(store string, limit int64, period time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nmax_connections = 1000\n\n[store]\n%s\ntimeout = %q\nsync_interval = \"100ms\"\n", store, fleetTimeout)
	for _, alg := range []string{"token_bucket", "gcra", "fixed_window", "sliding_counter"} {
		fmt.Fprintf(&b, "\n[[rule]]\nname = %q\nmatch = { alg = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = %d\nperiod = %q\n",
			alg, alg, alg, limit, period)
	}
	fmt.Fprintf(&b, "\n[[rule]]\nname = \"strict\"\nmatch = { alg = \"strict\" }\nby = [\"api_key\"]\nlimit = %d\nperiod = %q\nmode = \"strict\"\n", limit, period)
	return b.String()
}

// startFleet starts n in-process daemons on config.
func startFleet(t *testing.T, n int, config string) []*daemontest.Server {
	t.Helper()
	var fleet []*daemontest.Server
	for range n {
		fleet = append(fleet, start(t, config))
	}
	return fleet
}

// scriptCalls returns how many script calls Redis at addr ran on limit
// keys (rld:{…}) since resetStats: a daemon's heartbeat and its poll of
// the changes' version name other keys and are not counted.
func scriptCalls(t *testing.T, addr string) int {
	t.Helper()
	n, err := redistest.ScriptCallsOn(addr, "rld:{")
	require.NoError(t, err)
	return n
}

// commandCalls returns the calls of each command Redis at addr ran since
// the last CONFIG RESETSTAT (INFO commandstats), by lower-case name.
func commandCalls(t *testing.T, addr string) map[string]int {
	t.Helper()
	stats, err := redistest.Do(addr, "INFO", "commandstats")
	require.NoError(t, err)
	calls := map[string]int{}
	for _, line := range strings.Split(stats, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(num)
	}
	return calls
}

// resetStats zeroes the command counts of Redis at addr (commandCalls)
// and starts recording its commands afresh (scriptCalls).
func resetStats(t *testing.T, addr string) {
	t.Helper()
	_, err := redistest.Do(addr, "CONFIG", "RESETSTAT")
	require.NoError(t, err)
	require.NoError(t, redistest.RecordCommands(addr))
}

func descs(alg, key string) []client.Descriptor {
	return []client.Descriptor{{Name: "api_key", Value: key}, {Name: "alg", Value: alg}}
}

// TestCachedNotUnderLimit: a client at 80% of its limit, spread evenly
// over three daemons, is never refused, for every algorithm that
// leases: at least 10,000 checks each.
func TestCachedNotUnderLimit(t *testing.T) {
	srv := redistest.Standalone(t)
	const limit, period = 3_000, time.Second
	fleet := startFleet(t, 3, cacheConfig(fmt.Sprintf("redis = [%q]", srv.Addr), limit, period))
	for _, alg := range []string{"token_bucket", "gcra", "fixed_window", "sliding_counter"} {
		t.Run(alg, func(t *testing.T) {
			t.Parallel() // one key per algorithm: the four run at once
			const checks = 10_200
			// One paced client per daemon, each at a third of 80%, on a
			// schedule that never catches up more than one interval, so
			// that no stretch of time offers much more than 80%.
			interval := time.Duration(float64(period) / (0.8 * limit / 3))
			var refused, errs atomic.Int64
			var firstRefusal atomic.Pointer[string]
			var wg sync.WaitGroup
			start := time.Now()
			for _, s := range fleet {
				c := client.New(s.Socket)
				defer c.Close()
				wg.Go(func() {
					next := time.Now()
					for range checks / 3 {
						time.Sleep(time.Until(next)) // pacing the load
						if next = next.Add(interval); time.Since(next) > interval {
							next = time.Now()
						}
						r, err := c.Check(context.Background(), descs(alg, "steady"), 1)
						switch {
						case err != nil:
							errs.Add(1)
						case !r.Allowed():
							if refused.Add(1) == 1 {
								msg := fmt.Sprintf("%+v", r)
								firstRefusal.Store(&msg)
							}
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			t.Logf("%s: %d checks in %v (%.0f%% of the limit): %d refused, %d errors",
				alg, checks, elapsed.Round(time.Millisecond), 100*float64(checks)/elapsed.Seconds()/limit, refused.Load(), errs.Load())
			if p := firstRefusal.Load(); p != nil {
				t.Errorf("first refusal: %s", *p)
			}
			assert.Zero(t, refused.Load())
			assert.Zero(t, errs.Load())
		})
	}
}

// TestCachedHotKeyRedisTraffic: a hot key well under its limit costs
// Redis at most 0.02 script calls per check, syncs included.
func TestCachedHotKeyRedisTraffic(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	fleet := startFleet(t, 3, cacheConfig(fmt.Sprintf("redis = [%q]", srv.Addr), 1_000_000, time.Second))
	resetStats(t, srv.Addr)
	const perClient = 4 // connections per daemon
	var checks atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(1500 * time.Millisecond)
	for _, s := range fleet {
		for range perClient {
			c := client.New(s.Socket)
			defer c.Close()
			wg.Go(func() {
				for time.Now().Before(deadline) {
					r, err := c.Check(context.Background(), descs("token_bucket", "hot"), 1)
					if assert.NoError(t, err) && assert.True(t, r.Allowed(), "%+v", r) {
						checks.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	calls := scriptCalls(t, srv.Addr)
	perCheck := float64(calls) / float64(checks.Load())
	t.Logf("%d checks of one hot key through 3 daemons: %d Redis script calls, %.4f per check", checks.Load(), calls, perCheck)
	assert.Greater(t, checks.Load(), int64(3000), "the key was hot")
	assert.LessOrEqual(t, perCheck, 0.02)
}

// TestCachedHammeredKeyRedisTraffic: a key checked at 100× its limit
// costs about one Redis call per daemon per retry-after period, however
// many checks arrive.
func TestCachedHammeredKeyRedisTraffic(t *testing.T) {
	srv := redistest.Standalone(t)
	const limit, period = 10, 500 * time.Millisecond
	fleet := startFleet(t, 3, cacheConfig(fmt.Sprintf("redis = [%q]", srv.Addr), limit, period))
	resetStats(t, srv.Addr)
	var checks, admitted atomic.Int64
	var wg sync.WaitGroup
	// Start on a window boundary, so that the run covers whole windows.
	t0 := time.Now().Truncate(period).Add(period)
	end := t0.Add(4 * period)
	time.Sleep(time.Until(t0)) // aligning the run with the windows, not synchronising
	for _, s := range fleet {
		c := client.New(s.Socket)
		defer c.Close()
		wg.Go(func() {
			// 100× the limit in all: a third of it through each daemon.
			interval := period / (100 * limit / 3)
			for next := time.Now(); next.Before(end); next = next.Add(interval) {
				time.Sleep(time.Until(next))
				r, err := c.Check(context.Background(), descs("fixed_window", "abuser"), 1)
				if assert.NoError(t, err) {
					checks.Add(1)
					if r.Allowed() {
						admitted.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	calls := scriptCalls(t, srv.Addr)
	windows := 4
	perDaemonPerWindow := float64(calls) / float64(len(fleet)*windows)
	t.Logf("%d checks (%.0f× the limit), %d admitted, over %d windows: %d Redis script calls, %.1f per daemon per retry-after period",
		checks.Load(), float64(checks.Load())/float64(limit*windows), admitted.Load(), windows, calls, perDaemonPerWindow)
	assert.LessOrEqual(t, admitted.Load(), int64(limit*(windows+1)))
	// Per daemon and window: the call that takes its share, the one
	// that learns of the denial, and the sync's return of a lease.
	assert.LessOrEqual(t, perDaemonPerWindow, 4.0)
}

// TestStrictCoalescesOnRedis: concurrent strict checks of one key share
// Redis calls: calls ≤ checks ÷ average batch size, and never over the
// limit.
func TestStrictCoalescesOnRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	s := start(t, cacheConfig(fmt.Sprintf("redis = [%q]", srv.Addr), 1_000_000, time.Hour))
	resetStats(t, srv.Addr)
	const conns, each = 32, 200
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range conns {
		c := client.New(s.Socket)
		defer c.Close()
		wg.Go(func() {
			for range each {
				r, err := c.Check(context.Background(), descs("strict", "busy"), 1)
				if assert.NoError(t, err) && r.Allowed() {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	calls := scriptCalls(t, srv.Addr)
	checks := conns * each
	t.Logf("%d strict checks from %d connections: %d Redis calls, average batch %.1f checks", checks, conns, calls, float64(checks)/float64(calls))
	assert.Equal(t, int64(checks), admitted.Load())
	assert.Less(t, calls, checks/2, "concurrent checks were batched")
}

// TestMovingClientOnRedis: a client that used one daemon moves to
// another, which gets the first one's unused lease within about one sync
// interval.
func TestMovingClientOnRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	fleet := startFleet(t, 2, cacheConfig(fmt.Sprintf("redis = [%q]", srv.Addr), 100, time.Hour))
	a, b := client.New(fleet[0].Socket), client.New(fleet[1].Socket)
	defer a.Close()
	defer b.Close()
	var onA atomic.Int64
	var wg sync.WaitGroup
	for range 20 { // concurrent checks, so that a leases ahead
		wg.Go(func() {
			for range 3 {
				r, err := a.Check(context.Background(), descs("fixed_window", "mover"), 1)
				if assert.NoError(t, err) && r.Allowed() {
					onA.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, int64(60), onA.Load())

	moved := time.Now()
	onB := int64(0)
	for onA.Load()+onB < 100 {
		require.Less(t, time.Since(moved), time.Second, "b got %d of the 40 left", onB)
		r, err := b.Check(context.Background(), descs("fixed_window", "mover"), 1)
		require.NoError(t, err)
		if r.Allowed() {
			onB++
			continue
		}
		require.LessOrEqual(t, r.RetryAfter, 100*time.Millisecond, "a denial that may be a's lease lasts one sync interval at most")
		time.Sleep(r.RetryAfter) // the client honours Retry-After
	}
	took := time.Since(moved)
	t.Logf("after 60 checks on a, b got the remaining %d in %v (sync interval 100ms)", onB, took.Round(time.Millisecond))
	assert.Less(t, took, 300*time.Millisecond, "about one sync interval")
}

// TestDenialsUnderTwoRulesCostRedisNothing: one key hammered under two
// cached rules (per key 5/min, then per tenant) on one daemon costs Redis
// about what it costs under the first rule alone, measured side by side
// on another Redis: once the key is denied, the peek of the tenant rule
// that looks for a longer denial is answered from the cache, or by one
// remembered store call per retry-after period, never by a call per
// check.
func TestDenialsUnderTwoRulesCostRedisNothing(t *testing.T) {
	const perKey = `
[[rule]]
name = "per_key"
by = ["api_key"]
limit = 5
period = "1m"
`
	const perTenant = `
[[rule]]
name = "per_tenant"
by = ["tenant"]
limit = 100000
period = "1m"
`
	var one, two int
	t.Run("group", func(t *testing.T) {
		t.Run("one rule", func(t *testing.T) {
			t.Parallel()
			one = hammerTwoRules(t, perKey)
		})
		t.Run("two rules", func(t *testing.T) {
			t.Parallel()
			two = hammerTwoRules(t, perKey+perTenant)
		})
	})
	t.Logf("script calls for one hammered key over 3 s: %d under one rule, %d under two", one, two)
	// The tenant rule adds its own takes of the 5 units admitted (about
	// two, with a lease), the return of that lease, and a peek per
	// retry-after period told: one short one (a sync interval) before the
	// key counts as hammered, then one of 12 s. Checking the tenant rule
	// on every denial would cost about 3,000.
	assert.LessOrEqual(t, two, one+6)
}

// hammerTwoRules checks one key (api_key abuser, tenant t1) at 1,000
// checks/s for 3 s through one daemon on its own Redis with rules, and
// returns the script calls Redis ran on limit keys. The
// per-key rule admits 5 units a minute: 5 are admitted, and the others
// denied with a retry-after of up to 12 s.
func hammerTwoRules(t *testing.T, rules string) int {
	srv := redistest.Standalone(t)
	store := fmt.Sprintf("[store]\nredis = [%q]\ntimeout = %q\nsync_interval = \"100ms\"\n", srv.Addr, fleetTimeout)
	s := start(t, store+rules)
	resetStats(t, srv.Addr)
	// 1,000 checks/s for 3 s, through two connections.
	const conns, rate, runFor = 2, 1000, 3 * time.Second
	var admitted, denied atomic.Int64
	var retryAfter atomic.Int64 // the longest retry-after told, ns
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(runFor)
	for range conns {
		c := client.New(s.Socket)
		defer c.Close()
		wg.Go(func() {
			d := []client.Descriptor{{Name: "api_key", Value: "abuser"}, {Name: "tenant", Value: "t1"}}
			interval := time.Second / (rate / conns)
			for next := time.Now(); next.Before(end); next = next.Add(interval) {
				time.Sleep(time.Until(next)) // pacing the load
				r, err := c.Check(context.Background(), d, 1)
				if !assert.NoError(t, err) {
					return
				}
				if r.Allowed() {
					admitted.Add(1)
					continue
				}
				denied.Add(1)
				if ra := int64(r.RetryAfter); ra > retryAfter.Load() {
					retryAfter.Store(ra) // racy, and only logged
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	calls := scriptCalls(t, srv.Addr)
	t.Logf("%d checks in %v: %d admitted, %d denied, longest retry-after %v; Redis: %d script calls",
		admitted.Load()+denied.Load(), elapsed.Round(time.Millisecond), admitted.Load(), denied.Load(),
		time.Duration(retryAfter.Load()).Round(time.Millisecond), calls)
	assert.Equal(t, int64(5), admitted.Load(), "the per-key limit")
	assert.Greater(t, denied.Load(), int64(2000), "the key was hammered")
	return calls
}
