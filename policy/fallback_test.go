package policy

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/memstore"
)

// fakeHealth is a Health with fixed answers.
type fakeHealth struct {
	peers   int
	retryAt time.Time
}

func (h fakeHealth) Peers() int         { return h.peers }
func (h fakeHealth) RetryAt() time.Time { return h.retryAt }

// openErr is a store error that says when to retry, as redisx's
// *breaker.OpenError does.
type openErr struct{ at time.Time }

func (e *openErr) Error() string      { return "breaker open" }
func (e *openErr) NextTry() time.Time { return e.at }

var errDown = errors.New("redis: connection refused")

// newFallbackPolicy compiles toml on st with a Fallback of options o.
func newFallbackPolicy(t *testing.T, toml string, st Store, o FallbackOptions) (*Policy, *Fallback) {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), t.Name()+".toml")
	require.NoError(t, err)
	if o.Clock == nil {
		o.Clock = func() time.Time { return t0 } // the checks' time
	}
	if o.NewLocal == nil {
		o.NewLocal = func() LocalStore { return memstore.New(memstore.Options{}) }
	}
	f := NewFallback(o)
	p, err := NewStores(cfg, Stores{Cached: st, Fallback: f})
	require.NoError(t, err)
	return p, f
}

// TestFallbackOpenFairShare: a fail-open rule whose store fails admits
// its share of the limit (the limit over the live daemons) on local
// state, degraded, then denies, degraded, with a retry-after.
func TestFallbackOpenFairShare(t *testing.T) {
	for _, tc := range []struct {
		peers int
		want  int64
	}{{0, 30}, {1, 30}, {3, 10}, {7, 4}, {100, 1}} {
		t.Run(fmt.Sprintf("peers=%d", tc.peers), func(t *testing.T) {
			st := newFakeStore()
			st.fail["r"] = errDown
			var h Health
			if tc.peers > 0 {
				h = fakeHealth{peers: tc.peers}
			}
			p, f := newFallbackPolicy(t, `
[[rule]]
name = "r"
by = ["ip"]
limit = 30
period = "1h"
`, st, FallbackOptions{Health: h})
			allowed := int64(0)
			for range 40 {
				d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil)
				require.True(t, d.Degraded, "%+v", d)
				require.Equal(t, "r", d.Rule)
				require.Equal(t, tc.want, d.Result.Limit, "the share is the limit here")
				if d.Status == StatusAllowedDegraded {
					allowed++
					continue
				}
				require.Equal(t, StatusLimited, d.Status, "%+v", d)
				require.Positive(t, d.Result.RetryAfter)
			}
			assert.Equal(t, tc.want, allowed)
			assert.True(t, f.Active())
			assert.Equal(t, max(tc.peers, 1), f.Peers())
		})
	}
}

// TestFallbackClosed: a fail-closed rule whose store fails denies,
// degraded, with a retry-after until the next probe: the error's, else
// the Health's, else the store's timeout, else a second; at least 1 ms.
func TestFallbackClosed(t *testing.T) {
	const rules = `
[[rule]]
name = "login"
by = ["user"]
limit = 5
period = "1m"
mode = "strict"
fail = "closed"
`
	for _, tc := range []struct {
		name    string
		err     error
		health  Health
		timeout time.Duration
		want    time.Duration
	}{
		{"breaker error", fmt.Errorf("take: %w", &openErr{t0.Add(120 * time.Millisecond)}), fakeHealth{1, t0.Add(time.Second)}, 0, 120 * time.Millisecond},
		{"probe due", &openErr{t0.Add(-time.Second)}, nil, 0, time.Millisecond},
		{"health", errDown, fakeHealth{2, t0.Add(80 * time.Millisecond)}, 5 * time.Millisecond, 80 * time.Millisecond},
		{"timeout", errDown, fakeHealth{2, time.Time{}}, 5 * time.Millisecond, 5 * time.Millisecond},
		{"nothing known", errDown, nil, 0, DefaultClosedRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newFakeStore()
			st.fail["login"] = tc.err
			p, f := newFallbackPolicy(t, rules, st, FallbackOptions{Health: tc.health, Timeout: tc.timeout})
			d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("user=u"), Cost: 1}, nil)
			assert.Equal(t, StatusLimited, d.Status)
			assert.True(t, d.Degraded)
			assert.Equal(t, "login", d.Rule)
			assert.Equal(t, tc.want, d.Result.RetryAfter)
			assert.Equal(t, int64(5), d.Result.Limit)
			assert.True(t, f.Active(), "a fail-closed refusal for a failed store is a fail mode deciding too")
		})
	}
}

// TestFallbackHierarchy: a rule decided locally takes part in a
// hierarchical check like any other: its admission is refunded to the
// local state when a later rule denies, and a later local denial refunds
// the store's take of an earlier rule.
func TestFallbackHierarchy(t *testing.T) {
	st := newFakeStore()
	p, f := newFallbackPolicy(t, `
[[rule]]
name = "key"
by = ["key"]
limit = 100
period = "1h"
[[rule]]
name = "tenant"
by = ["tenant"]
limit = 4
period = "1h"
`, st, FallbackOptions{Health: fakeHealth{peers: 2}})
	check := func() Decision {
		return p.Check(context.Background(), &Request{Now: t0, Descs: descs("key=k", "tenant=t"), Cost: 1}, nil)
	}
	// The tenant's store fails: its share of 4 over 2 daemons is 2.
	st.fail["tenant"] = errDown
	for i := range 2 {
		d := check()
		require.Equal(t, StatusAllowedDegraded, d.Status, "check %d: %+v", i, d)
	}
	d := check()
	require.Equal(t, StatusLimited, d.Status)
	require.True(t, d.Degraded)
	assert.Equal(t, "tenant", d.Rule)
	assert.Equal(t, int64(2), st.usedOf(key("key", "k")), "the denied check's take of key was refunded")
	assert.Contains(t, st.refunds, key("key", "k"))

	// Now the key's store fails instead and the tenant's answers: the
	// key's local admission is refunded when the tenant denies.
	delete(st.fail, "tenant")
	st.fail["key"] = errDown
	for range 4 {
		require.Equal(t, StatusAllowedDegraded, check().Status)
	}
	d = check()
	require.Equal(t, StatusLimited, d.Status)
	assert.False(t, d.Degraded, "the tenant's store decided")
	// The key's local share is 50: 5 taken, the denied check's refunded.
	share := algo.Params{Kind: algo.TokenBucket, Limit: 50, Period: time.Hour}
	r, err := f.local(t0).Take(context.Background(), []byte(key("key", "k")), share, 1, t0, true)
	require.NoError(t, err)
	assert.Equal(t, int64(46), r.Remaining+1, "a peek's Remaining is after its cost")
}

// slowStore fails every take with a deadline that passed, and counts
// them.
type slowStore struct{ *fakeStore }

func (s slowStore) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	s.mu.Lock()
	s.takes++
	s.mu.Unlock()
	return algo.Result{}, fmt.Errorf("shardcache: %w", context.DeadlineExceeded)
}

// TestFallbackTimeoutAsksNoMore: once a store call of a check timed out,
// the check's other rules are decided by their fail modes without asking
// the store: the check waits for one timeout at most.
func TestFallbackTimeoutAsksNoMore(t *testing.T) {
	st := slowStore{newFakeStore()}
	p, _ := newFallbackPolicy(t, `
[[rule]]
name = "a"
by = ["ip"]
limit = 10
period = "1h"
[[rule]]
name = "b"
by = ["ip"]
limit = 10
period = "1h"
[[rule]]
name = "c"
by = ["ip"]
limit = 10
period = "1h"
fail = "closed"
`, st, FallbackOptions{})
	d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil)
	assert.Equal(t, StatusLimited, d.Status)
	assert.True(t, d.Degraded)
	assert.Equal(t, "c", d.Rule)
	assert.Equal(t, 1, st.takeCount(), "one store call, then no more")
}

// TestFallbackForget: the local state of an outage is dropped once
// unused for Forget, and the next outage starts afresh.
func TestFallbackForget(t *testing.T) {
	clock := t0 // the checks', Active's and Sweep's time
	st := newFakeStore()
	st.fail["r"] = errDown
	p, f := newFallbackPolicy(t, `
[[rule]]
name = "r"
by = ["ip"]
limit = 2
period = "1h"
`, st, FallbackOptions{Forget: time.Minute, Clock: func() time.Time { return clock }})
	use := func() (allowed int) {
		for range 3 {
			if p.Check(context.Background(), &Request{Now: clock, Descs: descs("ip=1"), Cost: 1}, nil).Status.Allowed() {
				allowed++
			}
		}
		return allowed
	}
	assert.Equal(t, 2, use())
	clock = clock.Add(30 * time.Second)
	assert.Equal(t, 0, use(), "the same outage: the local state holds")
	assert.False(t, f.Sweep(clock.Add(time.Minute)), "used within Forget: kept")
	assert.True(t, f.Active())
	clock = clock.Add(time.Minute + time.Nanosecond)
	assert.False(t, f.Active(), "unused for Forget")
	assert.True(t, f.Sweep(clock), "unused for Forget: dropped")
	assert.False(t, f.Active())
	assert.Equal(t, 2, use(), "a new outage starts afresh")
	assert.True(t, f.Active())
}

// TestFallbackMetrics: degraded decisions are counted as such.
func TestFallbackMetrics(t *testing.T) {
	st := newFakeStore()
	st.fail["metered-open"] = errDown
	st.fail["metered-closed"] = errDown
	p, _ := newFallbackPolicy(t, `
[[rule]]
name = "metered-open"
match = { kind = "open" }
by = ["ip"]
limit = 1
period = "1h"
[[rule]]
name = "metered-closed"
match = { kind = "closed" }
by = ["ip"]
limit = 1
period = "1h"
fail = "closed"
`, st, FallbackOptions{})
	get := func(rule, dec string) uint64 {
		return metrics.GetOrCreateCounter(fmt.Sprintf(`rld_checks_total{rule=%q,decision=%q}`, rule, dec)).Get()
	}
	// The counters are the process's: what this run adds is counted, so
	// that the test passes however many times it runs.
	series := [][2]string{
		{"metered-open", "allowed_degraded"}, {"metered-open", "limited_degraded"},
		{"metered-closed", "limited_degraded"}, {"metered-open", "error"},
	}
	before := make([]uint64, len(series))
	for i, s := range series {
		before[i] = get(s[0], s[1])
	}
	for _, kind := range []string{"open", "open", "closed"} {
		p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1", "kind="+kind), Cost: 1}, nil)
	}
	for i, want := range []uint64{1, 1, 1, 0} {
		assert.Equal(t, want, get(series[i][0], series[i][1])-before[i], "%s %s", series[i][0], series[i][1])
	}
}

func TestFairShare(t *testing.T) {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, Period: time.Minute, Burst: 150}
	assert.Equal(t, p, fairShare(p, 1))
	assert.Equal(t, algo.Params{Kind: algo.TokenBucket, Limit: 33, Period: time.Minute, Burst: 50}, fairShare(p, 3))
	assert.Equal(t, algo.Params{Kind: algo.TokenBucket, Limit: 1, Period: time.Minute, Burst: 1}, fairShare(p, 1000))
	assert.Equal(t, int64(0), fairShare(algo.Params{Limit: 10}, 3).Burst, "0 stays 0: the limit")
}

// TestFallbackCost: a cost above the limit's capacity is an error as
// usual; a cost within the limit but above the daemon's share is denied
// for the limit's period, not for ever.
func TestFallbackCost(t *testing.T) {
	st := newFakeStore()
	st.fail["r"] = errDown
	p, _ := newFallbackPolicy(t, `
[[rule]]
name = "r"
by = ["ip"]
limit = 30
period = "1m"
`, st, FallbackOptions{Health: fakeHealth{peers: 3}})
	d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 31}, nil)
	assert.Equal(t, StatusError, d.Status)
	assert.Equal(t, CodeCostTooLarge, d.Code)
	assert.ErrorIs(t, d.Err, ErrCostTooLarge)
	d = p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 15}, nil)
	assert.Equal(t, StatusLimited, d.Status)
	assert.True(t, d.Degraded)
	assert.Equal(t, time.Minute, d.Result.RetryAfter)
}

// TestFallbackSeededFromKnown: with a Seed, a key's local state starts
// from this daemon's share of what the daemon last knew of its remaining
// quota, for every cached algorithm: a key the fleet had used up stays
// refused, a key with some left gets its share of that; a key the Seed
// knows nothing of starts from a full share.
func TestFallbackSeededFromKnown(t *testing.T) {
	for _, alg := range []string{"token_bucket", "gcra", "fixed_window", "sliding_counter", "sliding_log"} {
		t.Run(alg, func(t *testing.T) {
			st := newFakeStore()
			st.fail["r"] = errDown
			known := map[string]int64{}
			var asked []algo.Params
			seed := func(key []byte, p algo.Params, now time.Time) (int64, bool) {
				asked = append(asked, p)
				r, ok := known[string(key[len("r\x00"):])]
				return r, ok
			}
			p, _ := newFallbackPolicy(t, fmt.Sprintf(`
[[rule]]
name = "r"
by = ["ip"]
algorithm = %q
limit = 30
period = "1h"
`, alg), st, FallbackOptions{Health: fakeHealth{peers: 3}, Seed: seed})
			// The counter key is the rule name, a zero byte, then the
			// value's uvarint length and the value.
			known["\x04used"] = 0
			known["\x04some"] = 12
			admitted := func(ip string) int {
				n := 0
				for range 40 {
					d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=" + ip), Cost: 1}, nil)
					require.True(t, d.Degraded)
					if d.Status == StatusAllowedDegraded {
						n++
					}
				}
				return n
			}
			assert.Equal(t, 0, admitted("used"), "the fleet had used it up")
			assert.Equal(t, 4, admitted("some"), "a third of the 12 known left")
			assert.Equal(t, 10, admitted("unknown"), "a full share of 30 over 3")
			require.NotEmpty(t, asked)
			assert.Equal(t, int64(30), asked[0].Limit, "asked with the rule's limit, not the share")
		})
	}
}
