package policy

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/memstore"
)

var (
	_ Store      = (*memstore.Store)(nil)
	_ LocalStore = (*memstore.Store)(nil)
)

// TestMemstoreCapabilities: a rule on the embedded store runs ops and
// holds slots by id, found when the policy is compiled; it answers no
// check inline and no denial's peek from memory (it has no wait to save).
func TestMemstoreCapabilities(t *testing.T) {
	cfg, err := config.Load("../rld.toml")
	require.NoError(t, err)
	p, err := New(cfg, memstore.New(memstore.Options{}))
	require.NoError(t, err)
	for i := range p.rules {
		r := &p.rules[i]
		assert.NotNil(t, r.ops, r.name)
		assert.NotNil(t, r.slots, r.name)
		assert.Nil(t, r.denial, r.name)
		assert.Nil(t, r.local, r.name)
	}
}

// TestShippedConfigWithMemstore drives the shipped rld.toml on the
// embedded store through the scenarios.
func TestShippedConfigWithMemstore(t *testing.T) {
	cfg, err := config.Load("../rld.toml")
	require.NoError(t, err)
	p, err := New(cfg, memstore.New(memstore.Options{}))
	require.NoError(t, err)
	ctx := context.Background()
	var sc Scratch
	check := func(now time.Time, cost int64, pairs ...string) Decision {
		t.Helper()
		return p.Check(ctx, &Request{Now: now, Descs: descs(pairs...), Cost: cost}, &sc)
	}

	// /search: 30 per minute per key; the token bucket refills one every 2 s.
	for i := range 30 {
		d := check(t0, 1, "api_key=demo", "endpoint=/v1/search")
		require.Equal(t, StatusAllowed, d.Status, "search %d", i)
		assert.Equal(t, "search", d.Rule)
		assert.Equal(t, int64(29-i), d.Result.Remaining)
	}
	d := check(t0, 1, "api_key=demo", "endpoint=/v1/search")
	assert.Equal(t, StatusLimited, d.Status)
	assert.Equal(t, "search", d.Rule)
	assert.Equal(t, int64(30), d.Result.Limit)
	assert.Equal(t, 2*time.Second, d.Result.RetryAfter)
	assert.Equal(t, time.Minute, d.Period)
	d = check(t0.Add(2*time.Second), 1, "api_key=demo", "endpoint=/v1/search")
	assert.Equal(t, StatusAllowed, d.Status)

	// The per-tier rule (free: 100/min, the fallback; a token every 0.6 s)
	// lost nothing to the denial: 100 - 30 at t0, +3 tokens by t0+2s, -1
	// for the second search, -1 for this check. With less remaining than
	// users (99), it decides.
	d = check(t0.Add(2*time.Second), 1, "api_key=demo", "endpoint=/v1/users")
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "per-tier", d.Rule)
	assert.Equal(t, int64(100-30+3-1-1), d.Result.Remaining)

	// Tiers.
	d = check(t0, 1, "api_key=big", "tier=enterprise", "endpoint=/v1/users")
	assert.Equal(t, "users", d.Rule)
	assert.Equal(t, int64(99), d.Result.Remaining)
	d = check(t0, 1, "api_key=big", "tier=enterprise", "endpoint=/v1/other")
	assert.Equal(t, "per-tier", d.Rule)
	assert.Equal(t, int64(10000), d.Result.Limit)

	// Internal and revoked keys.
	assert.Equal(t, Decision{Status: StatusAllowed, Rule: RuleAllow}, check(t0, 1, "api_key=sk_internal_x", "endpoint=/v1/search"))
	assert.Equal(t, Decision{Status: StatusBlocked, Rule: RuleDeny}, check(t0, 1, "api_key=sk_revoked_x", "endpoint=/v1/search"))

	// Login: 5 per minute per ip, exact.
	for i := range 5 {
		d = check(t0.Add(time.Duration(i)*time.Second), 1, "ip=203.0.113.7", "endpoint=/v1/login")
		require.Equal(t, StatusAllowed, d.Status, "login %d", i)
	}
	d = check(t0.Add(30*time.Second), 1, "ip=203.0.113.7", "endpoint=/v1/login")
	assert.Equal(t, StatusLimited, d.Status)
	assert.Equal(t, "login", d.Rule)
	assert.Equal(t, 30*time.Second, d.Result.RetryAfter)

	// Hierarchical refund on the real algorithms: a per-key denial gives
	// the tenant's token back.
	for i := range 30 {
		d = check(t0, 1, "api_key=k2", "tenant=acme", "endpoint=/v1/search")
		require.Equal(t, StatusAllowed, d.Status, "tenant %d", i)
	}
	for range 10 {
		d = check(t0, 1, "api_key=k2", "tenant=acme", "endpoint=/v1/search")
		require.Equal(t, StatusLimited, d.Status)
	}
	d = p.Check(ctx, &Request{Now: t0, Descs: descs("tenant=acme"), Cost: 1, Peek: true}, &sc)
	assert.Equal(t, "per-tenant", d.Rule)
	// A peek reports what would remain after its cost: 20000 - 30 - 1.
	assert.Equal(t, int64(20000-30-1), d.Result.Remaining, "tenant charged for the 30 admitted checks only")
}

func TestMemstoreAllocations(t *testing.T) {
	cfg, err := config.Load("../rld.toml")
	require.NoError(t, err)
	p, err := New(cfg, memstore.New(memstore.Options{}))
	require.NoError(t, err)
	req := descs("api_key=sk_live_123", "endpoint=/v1/search", "tier=pro", "tenant=acme")
	var sc Scratch
	ctx := context.Background()
	now := t0
	p.Check(ctx, &Request{Now: now, Descs: req, Cost: 1}, &sc)
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Second) // keep the keys under their limits
		p.Check(ctx, &Request{Now: now, Descs: req, Cost: 1}, &sc)
	})
	assert.LessOrEqual(t, allocs, 1.0)
}

// BenchmarkCheck measures one decision on a warm key of the embedded store:
// rule matching plus the store's Take.
func BenchmarkCheck(b *testing.B) {
	cases := []struct {
		name string
		toml string
		req  []descriptor.Descriptor
		step time.Duration // the clock's advance per check: keys stay under their limits
		want Status
	}{
		{"one-rule", `
[[rule]]
name = "search"
match = { endpoint = "/v1/search*" }
by = ["api_key"]
limit = 100000000
period = "1m"
`, descs("api_key=sk_live_1234567890", "endpoint=/v1/search"), time.Millisecond, StatusAllowed},
		// /v1/search: the rules search, per-tier and per-tenant apply.
		{"shipped-rld.toml", "", descs("api_key=sk_live_1234567890", "endpoint=/v1/search", "tier=pro", "tenant=acme"), 2 * time.Second, StatusAllowed},
		{"allow-list", "", descs("api_key=sk_internal_1", "endpoint=/v1/search"), 0, StatusAllowed},
		// The one-rule case with a regexp match and an enforce share
		// (this key is inside it).
		{"regexp-rollout", `
[[rule]]
name = "search"
match = { endpoint = "~/v1/(search|find)(/.*)?" }
by = ["api_key"]
limit = 100000000
period = "1m"
enforce = "50%"
`, descs("api_key=sk_live_1234567890", "endpoint=/v1/search"), time.Millisecond, StatusAllowed},
		// A hot key over its limit: per-tenant allows, search denies and
		// per-tenant's take is refunded.
		{"denied-with-refund", `
[[rule]]
name = "per-tenant"
by = ["tenant"]
limit = 100000000
period = "1m"
[[rule]]
name = "search"
by = ["api_key"]
limit = 1
period = "1h"
`, descs("api_key=sk_live_1234567890", "tenant=acme"), 0, StatusLimited},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var cfg *config.Config
			var err error
			if c.toml != "" {
				cfg, err = config.Parse([]byte(c.toml), "bench.toml")
			} else {
				cfg, err = config.Load("../rld.toml")
			}
			require.NoError(b, err)
			p, err := New(cfg, memstore.New(memstore.Options{}))
			require.NoError(b, err)
			var sc Scratch
			ctx := context.Background()
			p.Check(ctx, &Request{Now: t0, Descs: c.req, Cost: 1}, &sc)
			now := t0
			b.ReportAllocs()
			for b.Loop() {
				now = now.Add(c.step)
				if d := p.Check(ctx, &Request{Now: now, Descs: c.req, Cost: 1}, &sc); d.Status != c.want {
					b.Fatalf("check: %+v", d)
				}
			}
		})
	}
	b.Run("fake-store", func(b *testing.B) {
		p := newPolicy(b, "[[rule]]\nname = \"search\"\nmatch = { endpoint = \"/v1/search*\" }\nby = [\"api_key\"]\nlimit = 100000000\nperiod = \"1m\"\n", newFakeStore())
		req := descs("api_key=sk_live_1234567890", "endpoint=/v1/search")
		var sc Scratch
		b.ReportAllocs()
		for b.Loop() {
			p.Check(context.Background(), &Request{Now: t0, Descs: req, Cost: 1}, &sc)
		}
	})
}

// BenchmarkCheckParallel runs the one-rule check from every P, each
// goroutine with its own Scratch and key.
func BenchmarkCheckParallel(b *testing.B) {
	cfg, err := config.Load("../rld.toml")
	require.NoError(b, err)
	p, err := New(cfg, memstore.New(memstore.Options{}))
	require.NoError(b, err)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var sc Scratch
		req := descs("api_key=sk_"+time.Now().Format("150405.000000000"), "endpoint=/v1/search", "tier=enterprise")
		now := t0
		for pb.Next() {
			now = now.Add(2 * time.Second)
			p.Check(context.Background(), &Request{Now: now, Descs: req, Cost: 1}, &sc)
		}
	})
}

// TestLongestRetryAfter: when a short limit denies while a longer one is
// used up too, the answer carries the longer wait, not one that would only
// be refused again.
func TestLongestRetryAfter(t *testing.T) {
	p := newPolicy(t, `
[[rule]]
name = "per-second"
by = ["ip"]
algorithm = "fixed_window"
limit = 2
period = "1s"
[[rule]]
name = "per-hour"
by = ["ip"]
algorithm = "fixed_window"
limit = 2
period = "1h"
`, memstore.New(memstore.Options{}))
	t0 := time.Unix(1_800_000_000, 0)
	ctx := context.Background()
	for range 2 {
		require.True(t, p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil).Status.Allowed())
	}
	d := p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil)
	assert.Equal(t, StatusLimited, d.Status)
	assert.Equal(t, "per-hour", d.Rule)
	assert.Equal(t, time.Hour, d.Result.RetryAfter)
}

// TestShadowTakesAreRefunded: a shadow rule's take is given back when an
// enforcing rule denies, like any other take.
func TestShadowTakesAreRefunded(t *testing.T) {
	st := memstore.New(memstore.Options{})
	p := newPolicy(t, `
[[rule]]
name = "observe"
by = ["ip"]
algorithm = "fixed_window"
limit = 100
period = "1m"
shadow = true
[[rule]]
name = "enforce"
by = ["ip"]
algorithm = "fixed_window"
limit = 1
period = "1m"
`, st)
	t0 := time.Unix(1_800_000_000, 0)
	ctx := context.Background()
	require.True(t, p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil).Status.Allowed())
	for range 5 {
		require.Equal(t, StatusLimited, p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil).Status)
	}
	res, err := st.Take(ctx, []byte(key("observe", "1")), algo.Params{Kind: algo.FixedWindow, Limit: 100, Period: time.Minute}, 1, t0, true)
	require.NoError(t, err)
	// 100 - 1 admitted - 1 for the peek's own cost: the five denied checks
	// left nothing behind.
	assert.Equal(t, int64(98), res.Remaining, "only the admitted request counts against the shadow rule")
}
