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

const changesTOML = `
[[rule]]
name = "api"
by = ["api_key"]
limit = 10
period = "1m"
tiers = { gold = 20 }
[[rule]]
name = "ip"
by = ["ip"]
limit = 1000
period = "1m"
`

func compileChanges(t *testing.T, toml string, ch *Changes, st Store) *Policy {
	t.Helper()
	cfg, err := config.Parse([]byte(toml), t.Name()+".toml")
	require.NoError(t, err)
	p, err := Compile(cfg, ch, Stores{Cached: st})
	require.NoError(t, err)
	return p
}

// admitted counts how many of n checks of descs at now p admits.
func admitted(p *Policy, now time.Time, n int, pairs ...string) int {
	ok := 0
	for range n {
		if p.Check(context.Background(), &Request{Now: now, Descs: descs(pairs...), Cost: 1}, nil).Status == StatusAllowed {
			ok++
		}
	}
	return ok
}

// TestOverridePrecedence: a key override wins over a glob override, which
// wins over the tier and the rule's limit; an override may raise a limit
// above the rule's; a multiplier scales the tier's limit.
func TestOverridePrecedence(t *testing.T) {
	exp := t0.Add(time.Hour)
	ch := &Changes{Overrides: []Override{
		{ID: "g", Rule: "api", Match: map[string]string{"api_key": "team-*"}, Limit: 50, Expires: exp},
		{ID: "k", Rule: "api", Key: map[string]string{"api_key": "team-a"}, Limit: 100, Expires: exp},
		{ID: "m", Rule: "api", Match: map[string]string{"api_key": "x*"}, Multiplier: 0.5, Expires: exp},
	}}
	p := compileChanges(t, changesTOML, ch, newFakeStore())
	assert.Equal(t, 100, admitted(p, t0, 150, "api_key=team-a"), "key override")
	assert.Equal(t, 50, admitted(p, t0, 150, "api_key=team-b"), "glob override")
	assert.Equal(t, 10, admitted(p, t0, 150, "api_key=other"), "the rule's limit")
	assert.Equal(t, 10, admitted(p, t0, 150, "api_key=xa", "tier=gold"), "multiplier 0.5 of the gold tier's 20")
	assert.Empty(t, p.Orphans())

	d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("api_key=team-a"), Cost: 1, Peek: true}, nil)
	assert.Equal(t, int64(100), d.Params.Limit, "the decision carries the limit in force")
	e := p.Explain(context.Background(), &Request{Now: t0, Descs: descs("api_key=team-b"), Cost: 1})
	require.NotEmpty(t, e.Rules)
	assert.True(t, e.Rules[0].Overridden)
	assert.Equal(t, int64(50), e.Rules[0].Params.Limit)
}

// TestOverrideExpiry: an override stops applying at its expiry, by the
// check's now.
func TestOverrideExpiry(t *testing.T) {
	exp := t0.Add(30 * time.Second)
	ch := &Changes{Overrides: []Override{{ID: "k", Rule: "api", Key: map[string]string{"api_key": "a"}, Limit: 1, Expires: exp}}}
	p := compileChanges(t, changesTOML, ch, newFakeStore())
	assert.Equal(t, 1, admitted(p, exp.Add(-time.Nanosecond), 5, "api_key=a"))
	// The fake store's window is the minute: 1 already taken in it.
	assert.Equal(t, 9, admitted(p, exp, 20, "api_key=a"), "the rule's limit at the expiry")
}

// TestBlocks: a glob block and a key block answer blocked until their
// expiry; what the rules before took is refunded.
func TestBlocks(t *testing.T) {
	exp := t0.Add(time.Minute)
	ch := &Changes{Blocks: []Block{
		{ID: "b1", Match: map[string]string{"ip": "10.0.0.*"}, Expires: exp},
		{ID: "b2", Rule: "ip", Key: map[string]string{"ip": "192.0.2.1"}, Expires: exp},
	}}
	st := newFakeStore()
	p := compileChanges(t, changesTOML, ch, st)
	keyBlocked := metrics.GetOrCreateCounter(`rld_checks_total{rule="ip",decision="blocked"}`)
	denied := metrics.GetOrCreateCounter(`rld_checks_total{rule="deny",decision="blocked"}`)
	kb, dn := keyBlocked.Get(), denied.Get()
	d := p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=10.0.0.7"), Cost: 1}, nil)
	assert.Equal(t, StatusBlocked, d.Status)
	assert.Equal(t, RuleDeny, d.Rule)
	d = p.Check(context.Background(), &Request{Now: t0, Descs: descs("api_key=k", "ip=192.0.2.1"), Cost: 1}, nil)
	assert.Equal(t, StatusBlocked, d.Status)
	assert.Equal(t, "ip", d.Rule)
	assert.Equal(t, []string{"api\x00\x01k"}, st.refunds, "the api rule's take is refunded")
	assert.Equal(t, kb+1, keyBlocked.Get(), "a key block is counted under its rule")
	assert.Equal(t, dn+1, denied.Get(), "a glob block under the deny list")
	assert.Equal(t, StatusAllowed, p.Check(context.Background(), &Request{Now: t0, Descs: descs("ip=192.0.2.2"), Cost: 1}, nil).Status)
	assert.Equal(t, StatusAllowed, p.Check(context.Background(), &Request{Now: exp, Descs: descs("ip=10.0.0.7"), Cost: 1}, nil).Status, "expired")
	assert.Equal(t, StatusAllowed, p.Check(context.Background(), &Request{Now: exp, Descs: descs("ip=192.0.2.1"), Cost: 1}, nil).Status, "expired")
}

// TestChangesSurviveReload: a recompile with the Changes of the Policy in
// force keeps them; one whose rule is gone is reported, kept, and applies
// again when the rule returns.
func TestChangesSurviveReload(t *testing.T) {
	exp := t0.Add(time.Hour)
	ch := &Changes{Overrides: []Override{{ID: "k", Rule: "api", Key: map[string]string{"api_key": "a"}, Limit: 2, Expires: exp}}}
	st := newFakeStore()
	p := compileChanges(t, changesTOML, ch, st)
	p2 := compileChanges(t, "[[rule]]\nname = \"ip\"\nby = [\"ip\"]\nlimit = 5\nperiod = \"1m\"\n", p.Changes(), st)
	assert.Equal(t, []Orphan{{ID: "k", Rule: "api"}}, p2.Orphans())
	p3 := compileChanges(t, changesTOML, p2.Changes(), st)
	assert.Empty(t, p3.Orphans())
	assert.Equal(t, 2, admitted(p3, t0, 5, "api_key=a"))
}

// TestValidateChanges: bad changes are refused with a clear error.
func TestValidateChanges(t *testing.T) {
	p := compileChanges(t, changesTOML, nil, newFakeStore())
	exp := t0.Add(time.Hour)
	ok := Override{Rule: "api", Key: map[string]string{"api_key": "a"}, Limit: 5, Expires: exp}
	require.NoError(t, p.ValidateOverride(&ok, t0))
	bad := map[string]Override{
		"unknown rule":   {Rule: "nope", Key: map[string]string{"api_key": "a"}, Limit: 5, Expires: exp},
		"wrong key":      {Rule: "api", Key: map[string]string{"ip": "a"}, Limit: 5, Expires: exp},
		"bad glob":       {Rule: "api", Match: map[string]string{"api_key": ""}, Limit: 5, Expires: exp},
		"past expiry":    {Rule: "api", Key: map[string]string{"api_key": "a"}, Limit: 5, Expires: t0},
		"zero limit":     {Rule: "api", Key: map[string]string{"api_key": "a"}, Expires: exp},
		"negative limit": {Rule: "api", Key: map[string]string{"api_key": "a"}, Limit: -1, Expires: exp},
		"bad multiplier": {Rule: "api", Key: map[string]string{"api_key": "a"}, Multiplier: -2, Expires: exp},
		"both":           {Rule: "api", Key: map[string]string{"api_key": "a"}, Limit: 1, Multiplier: 2, Expires: exp},
		"no target":      {Rule: "api", Limit: 5, Expires: exp},
	}
	for name, o := range bad {
		err := p.ValidateOverride(&o, t0)
		assert.Error(t, err, name)
		if name == "unknown rule" {
			assert.True(t, errors.Is(err, ErrUnknownRule))
		}
	}
	require.NoError(t, p.ValidateBlock(&Block{Match: map[string]string{"ip": "10.*"}, Expires: exp}, t0))
	require.NoError(t, p.ValidateBlock(&Block{Rule: "ip", Key: map[string]string{"ip": "1"}, Expires: exp}, t0))
	assert.Error(t, p.ValidateBlock(&Block{Expires: exp}, t0))
	assert.Error(t, p.ValidateBlock(&Block{Match: map[string]string{"ip": "10.*"}, Expires: t0}, t0))
	assert.ErrorIs(t, p.ValidateBlock(&Block{Rule: "x", Key: map[string]string{"ip": "1"}, Expires: exp}, t0), ErrUnknownRule)
}

// TestChangesCheckAllocs: a check under overrides and blocks allocates
// nothing once warm.
func TestChangesCheckAllocs(t *testing.T) {
	exp := t0.Add(time.Hour)
	ch := &Changes{
		Overrides: []Override{
			{ID: "g", Rule: "api", Match: map[string]string{"api_key": "team-*"}, Limit: 1 << 40, Expires: exp},
			{ID: "k", Rule: "api", Key: map[string]string{"api_key": "team-a"}, Limit: 1 << 40, Expires: exp},
		},
		Blocks: []Block{{ID: "b", Match: map[string]string{"ip": "10.*"}, Expires: exp},
			{ID: "c", Rule: "ip", Key: map[string]string{"ip": "10.1.1.1"}, Expires: exp}},
	}
	p := compileChanges(t, changesTOML, ch, newFakeStore())
	var sc Scratch
	ctx := context.Background()
	for _, req := range [][]string{{"api_key=team-a", "ip=1"}, {"api_key=team-b", "ip=2"}} {
		r := descs(req...)
		p.Check(ctx, &Request{Now: t0, Descs: r, Cost: 1}, &sc)
		allocs := testing.AllocsPerRun(1000, func() { p.Check(ctx, &Request{Now: t0, Descs: r, Cost: 1}, &sc) })
		assert.Zero(t, allocs, req)
	}
}

// BenchmarkCheckChanges measures a check of one rule without changes,
// and with 100 key overrides, 10 glob overrides and 10 glob blocks in
// force (the request matching none of the globs, its key overridden).
func BenchmarkCheckChanges(b *testing.B) {
	exp := t0.Add(time.Hour)
	var ch Changes
	for i := range 100 {
		ch.Overrides = append(ch.Overrides, Override{ID: fmt.Sprint("k", i), Rule: "api",
			Key: map[string]string{"api_key": fmt.Sprint("key-", i)}, Limit: 2000000000, Expires: exp})
	}
	for i := range 10 {
		ch.Overrides = append(ch.Overrides, Override{ID: fmt.Sprint("g", i), Rule: "api",
			Match: map[string]string{"api_key": fmt.Sprint("team-", i, "-*")}, Limit: 2000000000, Expires: exp})
		ch.Blocks = append(ch.Blocks, Block{ID: fmt.Sprint("b", i),
			Match: map[string]string{"ip": fmt.Sprint("10.", i, ".*")}, Expires: exp})
	}
	for _, bc := range []struct {
		name string
		ch   *Changes
	}{{"none", nil}, {"changes", &ch}} {
		b.Run(bc.name, func(b *testing.B) {
			toml := "[[rule]]\nname = \"api\"\nby = [\"api_key\"]\nlimit = 1000000000\nperiod = \"1s\"\n"
			cfg, err := config.Parse([]byte(toml), "bench.toml")
			require.NoError(b, err)
			p, err := Compile(cfg, bc.ch, Stores{Cached: newFakeStore()})
			require.NoError(b, err)
			req := descs("api_key=key-7", "ip=192.0.2.1")
			var sc Scratch
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, &sc)
			}
		})
	}
}

// TestOperateUnderOverride: a grant tops a key up within the limit in
// force, an override's when one applies, and not the rule's; the answers
// of grant and reset are a check's under that limit.
func TestOperateUnderOverride(t *testing.T) {
	ctx := context.Background()
	exp := t0.Add(time.Hour)
	ch := &Changes{Overrides: []Override{
		{ID: "k", Rule: "api", Key: map[string]string{"api_key": "big"}, Limit: 1000, Expires: exp},
		{ID: "g", Rule: "api", Match: map[string]string{"api_key": "team-*"}, Limit: 500, Expires: exp},
	}}
	p := compileChanges(t, changesTOML, ch, memstore.New(memstore.Options{}))
	require.Equal(t, 50, admitted(p, t0, 50, "api_key=big"))

	key := Target{Rule: "api", Key: map[string]string{"api_key": "big"}}
	applied, err := p.Operate(ctx, t0, algo.OpGrant, 10, key)
	require.NoError(t, err)
	require.Len(t, applied, 1)
	require.NoError(t, applied[0].Err)
	assert.Equal(t, int64(1000), applied[0].Params.Limit)
	assert.Equal(t, int64(1000-50+10-1), applied[0].Result.Remaining, "what a check of cost 1 would leave")
	assert.Equal(t, 960, admitted(p, t0, 2000, "api_key=big"), "the grant added 10 to the 950 left")

	applied, err = p.Operate(ctx, t0, algo.OpReset, 0, key)
	require.NoError(t, err)
	assert.Equal(t, int64(999), applied[0].Result.Remaining)

	// A glob override, the counter named by descriptors.
	require.Equal(t, 500, admitted(p, t0, 600, "api_key=team-a"))
	applied, err = p.Operate(ctx, t0, algo.OpGrant, 7, Target{Rule: "api", Descriptors: descs("api_key=team-a")})
	require.NoError(t, err)
	assert.Equal(t, int64(500), applied[0].Params.Limit)
	assert.Equal(t, int64(6), applied[0].Result.Remaining)

	// No override: the rule's own limit caps the grant.
	require.Equal(t, 10, admitted(p, t0, 20, "api_key=plain"))
	applied, err = p.Operate(ctx, t0, algo.OpGrant, 100, Target{Rule: "api", Key: map[string]string{"api_key": "plain"}})
	require.NoError(t, err)
	assert.Equal(t, int64(10), applied[0].Params.Limit)
	assert.Equal(t, int64(9), applied[0].Result.Remaining)
}

// algorithmRules has a rule of each algorithm that limits overrides.
const algorithmRules = `
[[rule]]
name = "login"
by = ["ip"]
algorithm = "sliding_log"
mode = "strict"
limit = 5
period = "1m"
[[rule]]
name = "exports"
by = ["api_key"]
algorithm = "concurrency"
limit = 2
timeout = "30s"
[[rule]]
name = "window"
by = ["ip"]
algorithm = "fixed_window"
limit = 100
period = "1m"
[[rule]]
name = "bucket"
by = ["ip"]
limit = 100
period = "1m"
`

// TestValidateOverrideAlgorithm: an override is held to what the rule's
// algorithm can enforce, as the configuration is: sliding_log's highest
// limit, no period on a concurrency rule, a burst only on token_bucket
// and gcra.
func TestValidateOverrideAlgorithm(t *testing.T) {
	p := compileChanges(t, algorithmRules, nil, newFakeStore())
	exp := t0.Add(time.Hour)
	ip := map[string]string{"ip": "192.0.2.1"}
	key := map[string]string{"api_key": "a"}
	for _, ok := range []Override{
		{Rule: "login", Key: ip, Limit: 10000, Expires: exp},
		{Rule: "login", Key: ip, Multiplier: 2000, Expires: exp},
		{Rule: "exports", Key: key, Limit: 5, Expires: exp},
		{Rule: "bucket", Key: ip, Limit: 5, Burst: 20, Period: time.Second, Expires: exp},
	} {
		assert.NoError(t, p.ValidateOverride(&ok, t0), "%+v", ok)
	}
	bad := map[string]struct {
		o    Override
		want string
	}{
		"sliding_log limit":      {Override{Rule: "login", Key: ip, Limit: 20000, Expires: exp}, "sliding_log keeps one entry per admission, so its limit is at most 10000"},
		"sliding_log multiplier": {Override{Rule: "login", Key: ip, Multiplier: 5000, Expires: exp}, "at most 10000"},
		"sliding_log burst":      {Override{Rule: "login", Key: ip, Limit: 5, Burst: 7, Expires: exp}, "only token_bucket and gcra take a burst, not sliding_log"},
		"fixed_window burst":     {Override{Rule: "window", Key: ip, Limit: 5, Burst: 7, Expires: exp}, "not fixed_window"},
		"concurrency period":     {Override{Rule: "exports", Key: key, Limit: 5, Period: time.Minute, Expires: exp}, "a concurrency rule has no period"},
	}
	for name, c := range bad {
		err := p.ValidateOverride(&c.o, t0)
		if assert.Error(t, err, name) {
			assert.Contains(t, err.Error(), c.want, name)
		}
	}

	// An override of a state file written before these checks applies
	// to nothing: it is reported as an orphan.
	p2 := compileChanges(t, algorithmRules, &Changes{Overrides: []Override{
		{ID: "old", Rule: "login", Key: ip, Limit: 20000, Expires: exp},
		{ID: "burst", Rule: "login", Key: map[string]string{"ip": "192.0.2.2"}, Limit: 5, Burst: 7, Expires: exp},
		{ID: "period", Rule: "exports", Key: key, Limit: 5, Period: time.Minute, Expires: exp},
	}}, newFakeStore())
	assert.ElementsMatch(t, []Orphan{{ID: "old", Rule: "login"}, {ID: "burst", Rule: "login"}, {ID: "period", Rule: "exports"}}, p2.Orphans())
}

// TestKeyOverrideNewestApplies: of two overrides of one key, the newer
// applies while it has not expired, whichever expires first; then the
// older one does, until its own expiry.
func TestKeyOverrideNewestApplies(t *testing.T) {
	key := map[string]string{"api_key": "a"}
	limit := func(p *Policy, at time.Time) int64 {
		return p.Check(context.Background(), &Request{Now: at, Descs: descs("api_key=a"), Cost: 1, Peek: true}, nil).Params.Limit
	}
	// The newer expires first: the older applies after it.
	p := compileChanges(t, changesTOML, &Changes{Overrides: []Override{
		{ID: "o1", Rule: "api", Key: key, Limit: 50, Expires: t0.Add(time.Hour)},
		{ID: "o2", Rule: "api", Key: key, Limit: 3, Expires: t0.Add(4 * time.Second)},
	}}, newFakeStore())
	assert.Equal(t, int64(3), limit(p, t0), "the newer override")
	assert.Equal(t, int64(50), limit(p, t0.Add(5*time.Second)), "the older one, once the newer expired")
	assert.Equal(t, int64(10), limit(p, t0.Add(2*time.Hour)), "the rule's, once both expired")

	// The newer outlives the older.
	p = compileChanges(t, changesTOML, &Changes{Overrides: []Override{
		{ID: "o1", Rule: "api", Key: key, Limit: 3, Expires: t0.Add(4 * time.Second)},
		{ID: "o2", Rule: "api", Key: key, Limit: 50, Expires: t0.Add(time.Hour)},
	}}, newFakeStore())
	assert.Equal(t, int64(50), limit(p, t0))
	assert.Equal(t, int64(50), limit(p, t0.Add(5*time.Second)))
}
