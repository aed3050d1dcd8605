package policy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
)

// fakeStore is a fixed-window counter per key, enough to drive Policy
// without the real algorithms. It records every call.
type fakeStore struct {
	mu sync.Mutex
	// guarded by mu:
	counts  map[string]*count
	takes   int
	refunds []string // keys refunded, in order
	fail    map[string]error
}

type count struct {
	window int64 // the window, as now / period
	used   int64 // units taken in it
}

func newFakeStore() *fakeStore {
	return &fakeStore{counts: map[string]*count{}, fail: map[string]error{}}
}

func (s *fakeStore) Take(_ context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.takes++
	for prefix, err := range s.fail {
		if strings.HasPrefix(string(key), prefix+"\x00") {
			return algo.Result{}, err
		}
	}
	capacity := p.Capacity()
	w := now.UnixNano() / int64(p.Period)
	c := s.counts[string(key)] // a lookup, unlike an assignment, does not allocate
	if c == nil {
		c = &count{}
		s.counts[string(key)] = c
	}
	if c.window != w {
		c.window, c.used = w, 0
	}
	reset := time.Duration((w+1)*int64(p.Period) - now.UnixNano())
	switch {
	case cost > capacity:
		return algo.Result{Limit: capacity, Remaining: capacity - c.used, Reset: reset, RetryAfter: algo.Never}, nil
	case c.used+cost > capacity:
		return algo.Result{Limit: capacity, Remaining: capacity - c.used, Reset: reset, RetryAfter: reset}, nil
	}
	if !peek {
		c.used += cost
	}
	return algo.Result{Allowed: true, Limit: capacity, Remaining: capacity - c.used, Reset: reset, At: now.UnixMicro()}, nil
}

func (s *fakeStore) Refund(_ context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refunds = append(s.refunds, string(key))
	if c := s.counts[string(key)]; c != nil && c.window == takenAt.UnixNano()/int64(p.Period) {
		c.used -= cost
	}
	return nil
}

// Do runs the ops an operator or a settle sends on the fake's counts: a
// reset drops the key, a grant or a refund gives units back, a charge
// takes them; it refuses the other kinds (the op's Err).
func (s *fakeStore) Do(_ context.Context, ops []algo.Op, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range ops {
		op := &ops[i]
		c := s.counts[string(op.Key)]
		if c == nil {
			c = &count{window: now.UnixNano() / int64(op.Params.Period)}
			s.counts[string(op.Key)] = c
		}
		switch op.Kind {
		case algo.OpReset:
			c.used = 0
		case algo.OpGrant, algo.OpRefund:
			c.used = max(c.used-op.N, 0)
		case algo.OpCharge:
			c.used += op.N
		default:
			op.Err = fmt.Errorf("fakeStore: runs no %s", op.Kind)
			continue
		}
		capacity := op.Params.Capacity()
		op.Result = algo.Result{Limit: capacity, Remaining: max(capacity-c.used, 0), At: now.UnixMicro()}
	}
	return nil
}

// takeOnly is a Store with no other capability: not an Operator.
type takeOnly struct{ s *fakeStore }

func (t takeOnly) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	return t.s.Take(ctx, key, p, cost, now, peek)
}

func (t takeOnly) Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	return t.s.Refund(ctx, key, p, cost, takenAt, now)
}

// TestCompileResolvesCapabilities: a store that runs no ops is refused
// when the policy is compiled, naming the capability; the optional ones
// are found once: the hot-key cache's faces and memstore's.
func TestCompileResolvesCapabilities(t *testing.T) {
	cfg := config.Default()
	cfg.Rules = []config.Rule{{Name: "x", By: []string{"ip"}, Algorithm: "token_bucket", Limit: 1, Period: config.Duration(time.Second)}}
	_, err := New(cfg, takeOnly{newFakeStore()})
	require.ErrorContains(t, err, `rule[0] "x": its store (policy.takeOnly) runs no ops (policy.Operator)`)

	p, err := New(cfg, newFakeStore())
	require.NoError(t, err)
	r := &p.rules[0]
	assert.NotNil(t, r.ops)
	assert.Nil(t, r.slots, "fakeStore holds no slots")
	assert.Nil(t, r.denial)
	assert.Nil(t, r.local)
}

// usedOf returns the units taken from key.
func (s *fakeStore) usedOf(key string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.counts[key]; c != nil {
		return c.used
	}
	return 0
}

func (s *fakeStore) takeCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.takes
}

// key builds a counter key the way Policy does.
func key(rule string, values ...string) string {
	b := append([]byte(rule), 0)
	for _, v := range values {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return string(b)
}

// descs turns "name=value" pairs into descriptors.
func descs(pairs ...string) []descriptor.Descriptor {
	out := make([]descriptor.Descriptor, len(pairs))
	for i, p := range pairs {
		name, value, _ := strings.Cut(p, "=")
		out[i] = descriptor.Descriptor{Name: []byte(name), Value: []byte(value)}
	}
	return out
}

func newPolicy(t testing.TB, toml string, st Store) *Policy {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), t.Name()+".toml")
	require.NoError(t, err)
	p, err := New(cfg, st)
	require.NoError(t, err)
	return p
}

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func TestAllowDeny(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, `
allow = ["api_key=sk_internal_*", "ip=10.*"]
deny  = ["api_key=sk_revoked_*", "api_key=sk_internal_bad"]
[[rule]]
name = "all"
by = ["api_key"]
limit = 1
period = "1m"
`, st)
	tests := []struct {
		descs  []descriptor.Descriptor
		status Status
		rule   string
	}{
		{descs("api_key=sk_revoked_1"), StatusBlocked, RuleDeny},
		{descs("api_key=sk_internal_1"), StatusAllowed, RuleAllow},
		{descs("api_key=sk_internal_bad"), StatusBlocked, RuleDeny},             // deny wins over allow
		{descs("api_key=sk_revoked_1", "ip=10.0.0.1"), StatusBlocked, RuleDeny}, // on any selector
		{descs("api_key=sk_x", "ip=10.0.0.1"), StatusAllowed, RuleAllow},
		{descs("ip=10.0.0.1", "api_key=sk_revoked_1"), StatusBlocked, RuleDeny},
		{descs("api_key=sk_x", "api_key=sk_revoked_1"), StatusAllowed, "all"}, // first occurrence counts
		{descs("api_key=sk_revoked_1", "api_key=sk_x"), StatusBlocked, RuleDeny},
	}
	for i, tt := range tests {
		for range 3 { // the allow list bypasses the limit of 1
			d := p.Check(context.Background(), &Request{Now: t0, Descs: tt.descs, Cost: 1}, nil)
			assert.Equal(t, tt.status, d.Status, "case %d", i)
			assert.Equal(t, tt.rule, d.Rule, "case %d", i)
			if tt.rule != "all" {
				assert.Zero(t, d.Result, "case %d", i)
			}
			if tt.rule == "all" {
				break
			}
		}
	}
	assert.Equal(t, 1, st.takeCount(), "allow and deny count nothing")
}

// TestHierarchicalRefund: the per-tenant rule allows, then the per-key rule
// denies, and the tenant's quota is given back.
func TestHierarchicalRefund(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, `
[[rule]]
name = "tenant"
by = ["tenant"]
limit = 10
period = "1m"
[[rule]]
name = "key"
by = ["api_key"]
limit = 2
period = "1m"
`, st)
	ctx := context.Background()
	req := descs("tenant=acme", "api_key=k1")
	for i := range 2 {
		d := p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, nil)
		require.Equal(t, StatusAllowed, d.Status)
		assert.Equal(t, "key", d.Rule, "least remaining")
		assert.Equal(t, int64(1-i), d.Result.Remaining)
	}
	assert.Equal(t, int64(2), st.usedOf(key("tenant", "acme")))

	d := p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, nil)
	assert.Equal(t, StatusLimited, d.Status)
	assert.Equal(t, "key", d.Rule)
	assert.Equal(t, int64(2), d.Result.Limit)
	assert.Equal(t, int64(0), d.Result.Remaining)
	assert.Equal(t, time.Minute, d.Result.RetryAfter)
	assert.Equal(t, time.Minute, d.Period)
	assert.Equal(t, int64(2), st.usedOf(key("tenant", "acme")), "tenant quota restored")
	assert.Equal(t, []string{key("tenant", "acme")}, st.refunds)

	// Another key of the tenant sees the tenant's remaining unchanged.
	d = p.Check(ctx, &Request{Now: t0, Descs: descs("tenant=acme", "api_key=k2"), Cost: 5}, nil)
	require.Equal(t, StatusError, d.Status) // 5 > capacity 2 of rule key
	d = p.Check(ctx, &Request{Now: t0, Descs: descs("tenant=acme", "api_key=k2"), Cost: 2}, nil)
	require.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "key", d.Rule)
	assert.Equal(t, int64(4), st.usedOf(key("tenant", "acme")))

	// Peek: decides, takes nothing, refunds nothing.
	st.refunds = nil
	d = p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1, Peek: true}, nil)
	assert.Equal(t, StatusLimited, d.Status)
	assert.Empty(t, st.refunds)
	assert.Equal(t, int64(4), st.usedOf(key("tenant", "acme")))
}

func TestCostTooLarge(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, `
[[rule]]
name = "tenant"
by = ["tenant"]
limit = 100
period = "1m"
[[rule]]
name = "burst"
by = ["tenant"]
limit = 3
burst = 4
period = "1s"
`, st)
	d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("tenant=acme"), Cost: 5}, nil)
	assert.Equal(t, StatusError, d.Status)
	assert.Equal(t, CodeCostTooLarge, d.Code)
	assert.Equal(t, "burst", d.Rule)
	assert.Equal(t, algo.Never, d.Result.RetryAfter)
	require.ErrorIs(t, d.Err, ErrCostTooLarge)
	assert.Equal(t, `cost exceeds the limit's capacity: cost 5, capacity 4 of rule "burst"`, d.Err.Error())
	assert.Equal(t, int64(0), st.usedOf(key("tenant", "acme")), "the tenant's take was refunded")

	d = p.Check(context.Background(), &Request{Now: t0, Descs: descs("tenant=acme"), Cost: 4}, nil)
	assert.Equal(t, StatusAllowed, d.Status)
}

func TestStoreError(t *testing.T) {
	st := newFakeStore()
	boom := errors.New("boom")
	st.fail["second"] = boom
	st.fail["shadowed"] = boom
	p := newPolicy(t, `
[[rule]]
name = "first"
by = ["ip"]
limit = 10
period = "1m"
[[rule]]
name = "shadowed"
by = ["ip"]
limit = 10
period = "1m"
shadow = true
[[rule]]
name = "second"
by = ["ip"]
limit = 10
period = "1m"
`, st)
	d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1.2.3.4"), Cost: 1}, nil)
	assert.Equal(t, StatusError, d.Status)
	assert.Equal(t, CodeInternal, d.Code)
	assert.Equal(t, "second", d.Rule)
	require.ErrorIs(t, d.Err, boom)
	assert.Contains(t, d.Err.Error(), `rule "second"`)
	assert.Equal(t, int64(0), st.usedOf(key("first", "1.2.3.4")))

	delete(st.fail, "second")
	d = p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1.2.3.4"), Cost: 1}, nil)
	assert.Equal(t, StatusAllowed, d.Status, "a failing shadow rule changes nothing")
}

func TestTiers(t *testing.T) {
	const rules = `
[[rule]]
name = "tiered"
by = ["api_key"]
tiers = { free = 2, pro = 5, enterprise = 50 }
period = "1m"
[[rule]]
name = "tiered-default"
by = ["user"]
tiers = { pro = 5 }
limit = 3
period = "1m"
`
	p := newPolicy(t, rules, newFakeStore())
	tests := []struct {
		descs []descriptor.Descriptor
		rule  string
		limit int64
	}{
		{descs("api_key=a", "tier=pro"), "tiered", 5},
		{descs("api_key=b", "tier=enterprise"), "tiered", 50},
		{descs("api_key=c", "tier=free"), "tiered", 2},
		{descs("api_key=d"), "tiered", 2},                          // no tier: the smallest
		{descs("api_key=e", "tier=gold"), "tiered", 2},             // unknown tier: the smallest
		{descs("api_key=f", "tier=PRO"), "tiered", 2},              // tiers are exact
		{descs("api_key=g", "tier=pro", "tier=free"), "tiered", 5}, // the first counts
		{descs("user=u1", "tier=pro"), "tiered-default", 5},
		{descs("user=u2", "tier=gold"), "tiered-default", 3}, // unknown tier: limit
		{descs("user=u3"), "tiered-default", 3},
	}
	for i, tt := range tests {
		d := p.Check(context.Background(), &Request{Now: t0, Descs: tt.descs, Cost: 1}, nil)
		assert.Equal(t, StatusAllowed, d.Status, "case %d", i)
		assert.Equal(t, tt.rule, d.Rule, "case %d", i)
		assert.Equal(t, tt.limit, d.Result.Limit, "case %d", i)
		assert.Equal(t, tt.limit-1, d.Result.Remaining, "case %d", i)
	}
}

func TestMatchAndBy(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, `
[[rule]]
name = "search"
match = { endpoint = "/v1/search*", method = "GET" }
by = ["api_key", "endpoint"]
limit = 5
period = "1m"
`, st)
	tests := []struct {
		descs []descriptor.Descriptor
		rule  string
	}{
		{descs("api_key=k", "endpoint=/v1/search", "method=GET"), "search"},
		{descs("method=GET", "endpoint=/v1/search/x", "api_key=k"), "search"}, // order does not matter
		{descs("api_key=k", "endpoint=/v1/search"), ""},                       // method missing: no match
		{descs("api_key=k", "endpoint=/v1/users", "method=GET"), ""},
		{descs("api_key=k", "endpoint=/v1/search", "method=POST"), ""},
		{descs("endpoint=/v1/search", "method=GET"), ""},                              // by api_key missing: not counted
		{descs("api_key=k", "endpoint=/v2", "endpoint=/v1/search", "method=GET"), ""}, // first occurrence
		{nil, ""},
	}
	for i, tt := range tests {
		d := p.Check(context.Background(), &Request{Now: t0, Descs: tt.descs, Cost: 1}, nil)
		assert.Equal(t, StatusAllowed, d.Status, "case %d", i)
		assert.Equal(t, tt.rule, d.Rule, "case %d", i)
		if tt.rule == "" {
			assert.Zero(t, d.Result, "case %d", i)
		}
	}
	assert.Equal(t, 2, st.takeCount())
	assert.Equal(t, int64(1), st.usedOf(key("search", "k", "/v1/search")))
	assert.Equal(t, int64(1), st.usedOf(key("search", "k", "/v1/search/x")))
}

func TestKeysDoNotCollide(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, `
[[rule]]
name = "a"
by = ["x", "y"]
limit = 1
period = "1m"
[[rule]]
name = "a:"
by = ["x"]
limit = 1
period = "1m"
`, st)
	ctx := context.Background()
	// "ab"+"c" and "a"+"bc" are different keys.
	assert.Equal(t, StatusAllowed, p.Check(ctx, &Request{Now: t0, Descs: descs("x=ab", "y=c"), Cost: 1}, nil).Status)
	assert.Equal(t, StatusAllowed, p.Check(ctx, &Request{Now: t0, Descs: descs("x=a", "y=bc"), Cost: 1}, nil).Status)
	assert.Equal(t, StatusLimited, p.Check(ctx, &Request{Now: t0, Descs: descs("x=a", "y=bc"), Cost: 1}, nil).Status)
	// Rules "a" and "a:" share nothing.
	d := p.Check(ctx, &Request{Now: t0, Descs: descs("x=q"), Cost: 1}, nil)
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "a:", d.Rule)
	assert.Equal(t, int64(1), st.usedOf(key("a", "ab", "c")))
	assert.Equal(t, int64(1), st.usedOf(key("a", "a", "bc")))
	assert.Equal(t, int64(1), st.usedOf(key("a:", "q")))
}

func TestShadow(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, `
[[rule]]
name = "shadow-tight"
by = ["ip"]
limit = 1
period = "1m"
shadow = true
[[rule]]
name = "real"
by = ["ip"]
limit = 3
period = "1m"
[[rule]]
name = "shadow-huge"
by = ["ip"]
limit = 1
period = "1m"
shadow = true
[[rule]]
name = "real-later"
match = { endpoint = "/x" }
by = ["ip"]
limit = 100
period = "1m"
`, st)
	shadowLimited := metrics.GetOrCreateCounter(`rld_checks_total{rule="shadow-tight",decision="shadow_limited"}`)
	before := shadowLimited.Get()
	ctx := context.Background()
	for i := range 3 {
		d := p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil)
		assert.Equal(t, StatusAllowed, d.Status, "check %d", i)
		assert.Equal(t, "real", d.Rule, "a shadow rule never decides")
		assert.Equal(t, int64(2-i), d.Result.Remaining)
	}
	assert.Equal(t, uint64(2), shadowLimited.Get()-before)
	d := p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil)
	assert.Equal(t, StatusLimited, d.Status)
	assert.Equal(t, "real", d.Rule)
	assert.Equal(t, int64(1), st.usedOf(key("shadow-tight", "1")), "shadow takes are not refunded")

	// A cost above a shadow rule's capacity does not fail the check.
	d = p.Check(ctx, &Request{Now: t0, Descs: descs("ip=2", "endpoint=/x"), Cost: 2}, nil)
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "real", d.Rule)

	// Only shadow rules apply: no rule decides.
	p = newPolicy(t, "[[rule]]\nname = \"s\"\nby = [\"ip\"]\nlimit = 1\nperiod = \"1m\"\nshadow = true\n", newFakeStore())
	for range 2 {
		d = p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil)
		assert.Equal(t, Decision{Status: StatusAllowed}, d)
	}
}

func TestLeastRemaining(t *testing.T) {
	p := newPolicy(t, `
[[rule]]
name = "big"
by = ["ip"]
limit = 10
period = "1h"
[[rule]]
name = "small-a"
by = ["ip"]
limit = 4
period = "1m"
[[rule]]
name = "small-b"
by = ["ip"]
limit = 4
period = "1s"
`, newFakeStore())
	d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 2}, nil)
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "small-a", d.Rule, "ties go to the first rule")
	assert.Equal(t, algo.Result{Allowed: true, Limit: 4, Remaining: 2, Reset: time.Minute, At: t0.UnixMicro()}, d.Result)
	assert.Equal(t, time.Minute, d.Period)

	d = p.Check(context.Background(), &Request{Now: t0.Add(time.Second), Descs: descs("ip=1"), Cost: 1}, nil)
	assert.Equal(t, "small-a", d.Rule) // small-b's window restarted: 3 left
	assert.Equal(t, int64(1), d.Result.Remaining)
}

func TestCostDefault(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, "[[rule]]\nname = \"r\"\nby = [\"ip\"]\nlimit = 5\nperiod = \"1m\"\n", st)
	for _, cost := range []int64{0, -3, 1} {
		p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: cost}, nil)
	}
	assert.Equal(t, int64(3), st.usedOf(key("r", "1")))
}

func TestMetrics(t *testing.T) {
	p := newPolicy(t, `
allow = ["ip=allowed"]
deny = ["ip=denied"]
[[rule]]
name = "metered"
by = ["ip"]
limit = 1
period = "1m"
`, newFakeStore())
	get := func(rule, decision string) uint64 {
		return metrics.GetOrCreateCounter(`rld_checks_total{rule="` + rule + `",decision="` + decision + `"}`).Get()
	}
	type series struct{ rule, decision string }
	all := []series{{"metered", "allowed"}, {"metered", "limited"}, {"metered", "error"}, {"allow", "allowed"}, {"deny", "blocked"}, {"none", "allowed"}}
	before := map[series]uint64{}
	ctx := context.Background()
	// Batch: each series is counted when the next check counts another,
	// and the last one at Flush.
	for _, batch := range []bool{false, true} {
		sc := &Scratch{Batch: batch}
		for _, s := range all {
			before[s] = get(s.rule, s.decision)
		}
		p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, sc)
		p.Check(ctx, &Request{Now: t0.Add(time.Hour), Descs: descs("ip=1"), Cost: 1}, sc)
		p.Check(ctx, &Request{Now: t0.Add(time.Hour), Descs: descs("ip=1"), Cost: 1}, sc)
		p.Check(ctx, &Request{Now: t0, Descs: descs("ip=1"), Cost: 9}, sc)
		p.Check(ctx, &Request{Now: t0, Descs: descs("ip=allowed"), Cost: 1}, sc)
		p.Check(ctx, &Request{Now: t0, Descs: descs("ip=denied"), Cost: 1}, sc)
		p.Check(ctx, &Request{Now: t0, Descs: descs("other=x"), Cost: 1}, sc)
		p.Check(ctx, &Request{Now: t0, Descs: descs("other=y"), Cost: 1}, sc)
		if batch {
			assert.Zero(t, get("none", "allowed")-before[series{"none", "allowed"}], "the last series waits for Flush")
			sc.Flush()
		}
		want := map[series]uint64{{"metered", "allowed"}: 2, {"none", "allowed"}: 2}
		for _, s := range all {
			assert.Equal(t, max(want[s], 1), get(s.rule, s.decision)-before[s], "batch=%v %v", batch, s)
		}
	}
}

func TestRules(t *testing.T) {
	p := newPolicy(t, `
[[rule]]
name = "b"
by = ["ip"]
limit = 1
period = "1m"
[[rule]]
name = "a"
by = ["ip"]
limit = 2
period = "1s"
shadow = true
`, newFakeStore())
	assert.Equal(t, []RuleInfo{
		{"b", "b: token_bucket 1/1m by ip cached fail=open"},
		{"a", "a: token_bucket 2/1s by ip cached fail=open shadow"},
	}, p.Rules())
}

func TestNewRejectsBadInput(t *testing.T) {
	_, err := New(nil, newFakeStore())
	assert.Error(t, err)
	_, err = New(config.Default(), nil)
	assert.Error(t, err)

	cfg := config.Default()
	cfg.Rules = []config.Rule{{Name: "x", By: []string{"ip"}, Algorithm: "leaky", Limit: 1, Period: config.Duration(time.Second)}}
	_, err = New(cfg, newFakeStore())
	assert.ErrorContains(t, err, `rule[0] "x": unknown algorithm "leaky"`)

	cfg.Rules[0].Algorithm = "token_bucket"
	cfg.Rules[0].Period = 0
	_, err = New(cfg, newFakeStore())
	assert.ErrorContains(t, err, `period must be at least 1ms`)

	cfg.Rules[0].Name = `a"b`
	_, err = New(cfg, newFakeStore())
	assert.ErrorContains(t, err, `name: character '"' not allowed`)

	cfg = config.Default()
	cfg.Deny = []string{"nope"}
	_, err = New(cfg, newFakeStore())
	assert.ErrorContains(t, err, `deny: selector "nope"`)
}

// TestConcurrent runs checks from many goroutines, each with its own
// Scratch, and counts what was admitted: exactly the limit.
func TestConcurrent(t *testing.T) {
	st := newFakeStore()
	p := newPolicy(t, `
[[rule]]
name = "tenant"
by = ["tenant"]
limit = 1000
period = "1m"
[[rule]]
name = "key"
by = ["api_key"]
limit = 50
period = "1m"
`, st)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sc Scratch
			req := descs("tenant=t", "api_key=k"+string(rune('0'+g%2)))
			n := 0
			for range 200 {
				if p.Check(context.Background(), &Request{Now: t0, Descs: req, Cost: 1}, &sc).Status == StatusAllowed {
					n++
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	assert.Equal(t, 100, admitted)
	assert.Equal(t, int64(100), st.usedOf(key("tenant", "t")), "every denial refunded the tenant")
}

func TestCheckAllocations(t *testing.T) {
	p := newPolicy(t, `
[[rule]]
name = "search"
match = { endpoint = "/v1/search*" }
by = ["api_key", "endpoint"]
limit = 100000000
period = "1m"
[[rule]]
name = "tenant"
by = ["tenant"]
limit = 100000000
period = "1m"
`, newFakeStore())
	req := descs("api_key=sk_123", "endpoint=/v1/search", "tenant=acme")
	var sc Scratch
	ctx := context.Background()
	p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, &sc)
	allocs := testing.AllocsPerRun(1000, func() {
		p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, &sc)
	})
	assert.Zero(t, allocs, "a warm check with the fake store")
}

// localStore is a fakeStore that answers on the host the takes of keys
// whose rule is in local, and no others (as the hot-key cache answers
// from a lease).
type localStore struct {
	*fakeStore
	local map[string]bool // rule names
}

func (s localStore) TakeLocal(key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, bool) {
	rule, _, _ := strings.Cut(string(key), "\x00")
	if !s.local[rule] {
		return algo.Result{}, false
	}
	r, err := s.Take(context.Background(), key, p, cost, now, peek)
	return r, err == nil
}

// TestTryCheck: TryCheckTo decides when every rule's store answers on the
// host, as CheckTo would; when one cannot, it reports false having taken
// nothing (what an earlier rule took is refunded) and counted nothing.
func TestTryCheck(t *testing.T) {
	st := localStore{fakeStore: newFakeStore(), local: map[string]bool{"a": true}}
	const toml = `
[[rule]]
name = "a"
by = ["ip"]
limit = 10
period = "1h"
[[rule]]
name = "b"
match = { kind = "two" }
by = ["ip"]
limit = 10
period = "1h"
`
	p := newPolicy(t, toml, st)
	var d Decision
	require.True(t, p.TryCheckTo(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil, &d))
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "a", d.Rule)
	assert.Equal(t, int64(9), d.Result.Remaining)

	allowedA := metrics.GetOrCreateCounter(`rld_checks_total{rule="a",decision="allowed"}`)
	before := allowedA.Get()
	assert.False(t, p.TryCheckTo(context.Background(), &Request{Now: t0, Descs: descs("ip=1", "kind=two"), Cost: 1}, nil, &d), "b's store would wait")
	assert.Equal(t, []string{"a\x00\x011"}, st.refunds, "a's take is given back")
	assert.Equal(t, before, allowedA.Get(), "nothing counted")
	d = p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1", "kind=two"), Cost: 1}, nil)
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, int64(8), d.Result.Remaining, "a: one take before, one now")
}

// TestCompile: a Policy is compiled from a configuration plus the
// run-time changes in force, with no file, and hands its changes on to
// the Policy that replaces it.
func TestCompile(t *testing.T) {
	cfg, err := config.Parse([]byte("[[rule]]\nname = \"r\"\nby = [\"ip\"]\nlimit = 1\nperiod = \"1h\"\n"), "inline")
	require.NoError(t, err)
	st := newFakeStore()
	p, err := Compile(cfg, &Changes{}, Stores{Cached: st})
	require.NoError(t, err)
	assert.Equal(t, StatusAllowed, p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil).Status)
	next, err := Compile(cfg, p.Changes(), Stores{Cached: st})
	require.NoError(t, err)
	assert.Equal(t, StatusLimited, next.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=1"), Cost: 1}, nil).Status, "the same store")
	_, err = Compile(nil, nil, Stores{Cached: st})
	assert.Error(t, err)
}
