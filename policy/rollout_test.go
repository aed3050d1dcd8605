package policy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/memstore"
)

// rolloutTOML is one rule of limit 1 per hour whose enforce share is %s.
const rolloutTOML = `
[[rule]]
name = "%s"
by = ["api_key"]
algorithm = "fixed_window"
limit = 1
period = "1h"
enforce = "%s"
`

// refusedKeys sends each of n keys three checks at t0 on p (one within
// its limit of 1, two over it) and returns which keys saw a refusal. It
// fails the test if a key is refused on its first check, or refused on
// one of its over-the-limit checks and not on the other.
func refusedKeys(t *testing.T, p *Policy, n int) []bool {
	t.Helper()
	ctx := context.Background()
	var sc Scratch
	refused := make([]bool, n)
	for k := range n {
		req := descs(fmt.Sprintf("api_key=k%d", k))
		require.True(t, p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, &sc).Status.Allowed(), "key %d: first check", k)
		a := p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, &sc).Status == StatusLimited
		b := p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, &sc).Status == StatusLimited
		require.Equal(t, a, b, "key %d: its over-the-limit checks are decided alike", k)
		refused[k] = a
	}
	return refused
}

// TestRolloutShare: with enforce = "25%" and a limit of 1, about a
// quarter of 10,000 keys sent over their limit are refused (±5 points);
// every refused key is in the share by its hash and every key outside it
// is admitted every time. Raising the share to 50% keeps every key
// enforced at 25% enforced, and enforces about half. The keys outside
// the share count as shadow denials, and in rld_rollout_limited_total.
func TestRolloutShare(t *testing.T) {
	const n = 10_000
	st := memstore.New(memstore.Options{})
	p25 := newPolicy(t, fmt.Sprintf(rolloutTOML, "rollout-share", "25%"), st)
	shadow := p25.rules[0].m[decShadowLimited].Get()
	rollout := RolloutLimited("rollout-share").Get()

	at25 := refusedKeys(t, p25, n)
	count25 := 0
	for k, r := range at25 {
		inShare := keyShare([]byte(key("rollout-share", fmt.Sprintf("k%d", k)))) < 2500
		require.Equal(t, inShare, r, "key %d: refused exactly when its hash is in the 25%% share", k)
		if r {
			count25++
		}
	}
	assert.InDelta(t, n/4, count25, n*0.05, "about a quarter of the keys are refused")
	// Each key outside the share went over its limit twice, admitted.
	assert.Equal(t, uint64(2*(n-count25)), p25.rules[0].m[decShadowLimited].Get()-shadow)
	assert.Equal(t, uint64(2*(n-count25)), RolloutLimited("rollout-share").Get()-rollout)

	// The same store, the keys still over their limit: a reload to 50%.
	p50 := newPolicy(t, fmt.Sprintf(rolloutTOML, "rollout-share", "50%"), st)
	ctx := context.Background()
	count50 := 0
	for k := range n {
		d := p50.Check(ctx, &Request{Now: t0, Descs: descs(fmt.Sprintf("api_key=k%d", k)), Cost: 1}, nil)
		if d.Status == StatusLimited {
			count50++
		} else {
			require.False(t, at25[k], "key %d was enforced at 25%% and is not at 50%%", k)
		}
	}
	assert.InDelta(t, n/2, count50, n*0.05, "about half of the keys are refused")
}

// TestRolloutEdges: 0% enforces no key (every check of a key over its
// limit is admitted and counted as shadow), 100% and the default every
// key.
func TestRolloutEdges(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		share   string
		refused int
	}{{"0%", 0}, {"100%", 200}, {"", 200}} {
		toml := fmt.Sprintf(rolloutTOML, "rollout-edge", c.share)
		if c.share == "" {
			toml = strings.Replace(toml, "enforce = \"\"\n", "", 1)
		}
		p := newPolicy(t, toml, memstore.New(memstore.Options{}))
		refused := 0
		for k := range 200 {
			req := descs(fmt.Sprintf("api_key=k%d", k))
			p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, nil)
			if p.Check(ctx, &Request{Now: t0, Descs: req, Cost: 1}, nil).Status == StatusLimited {
				refused++
			}
		}
		assert.Equal(t, c.refused, refused, "enforce = %q", c.share)
	}
}

// TestRolloutTiersOverridesAndExplain: tiers and overrides still set the
// limit of an enforced key; a key outside the share is never refused
// whatever its limit; Explain shows the share and whether the key is
// enforced, and matches what checks do.
func TestRolloutTiersOverridesAndExplain(t *testing.T) {
	const toml = `
[[rule]]
name = "rollout-tiers"
by = ["api_key"]
algorithm = "fixed_window"
limit = 1
tiers = { gold = 3 }
period = "1h"
enforce = "50%"
`
	// Keys on each side of the share, found by the hash.
	var in, out []string
	for k := 0; len(in) < 3 || len(out) < 3; k++ {
		v := fmt.Sprintf("u%d", k)
		if keyShare([]byte(key("rollout-tiers", v))) < 5000 {
			in = append(in, v)
		} else {
			out = append(out, v)
		}
	}
	exp := t0.Add(time.Hour)
	ch := &Changes{Overrides: []Override{
		{ID: "k", Rule: "rollout-tiers", Key: map[string]string{"api_key": in[2]}, Limit: 5, Expires: exp},
		{ID: "o", Rule: "rollout-tiers", Key: map[string]string{"api_key": out[2]}, Limit: 5, Expires: exp},
	}}
	p := compileChanges(t, toml, ch, memstore.New(memstore.Options{}))
	assert.Equal(t, 1, admitted(p, t0, 10, "api_key="+in[0]), "enforced: the base limit")
	assert.Equal(t, 3, admitted(p, t0, 10, "api_key="+in[1], "tier=gold"), "enforced: the tier's limit")
	assert.Equal(t, 5, admitted(p, t0, 10, "api_key="+in[2]), "enforced: the override's limit")
	assert.Equal(t, 10, admitted(p, t0, 10, "api_key="+out[0]), "not enforced")
	assert.Equal(t, 10, admitted(p, t0, 10, "api_key="+out[1], "tier=gold"), "not enforced, with a tier")
	assert.Equal(t, 10, admitted(p, t0, 10, "api_key="+out[2]), "not enforced, with an override")

	for _, c := range []struct {
		key      string
		enforced bool
		limit    int64
	}{{in[2], true, 5}, {out[0], false, 1}, {out[2], false, 5}} {
		e := p.Explain(context.Background(), &Request{Now: t0, Descs: descs("api_key=" + c.key), Cost: 1})
		require.Len(t, e.Rules, 1)
		m := e.Rules[0]
		assert.Equal(t, 5000, m.Enforce)
		assert.Equal(t, c.enforced, m.Enforced, "key %s", c.key)
		assert.Equal(t, c.limit, m.Params.Limit, "key %s", c.key)
		assert.False(t, m.Result.Allowed, "key %s is over its limit, enforced or not", c.key)
	}
}

// TestRolloutLongestDenial: a rule that does not enforce a key is not
// the one whose Retry-After a refusal by another rule reports.
func TestRolloutLongestDenial(t *testing.T) {
	const toml = `
[[rule]]
name = "per-minute"
by = ["api_key"]
algorithm = "fixed_window"
limit = 1
period = "1m"
[[rule]]
name = "per-day"
by = ["api_key"]
algorithm = "fixed_window"
limit = 1
period = "24h"
enforce = "50%"
`
	p := newPolicy(t, toml, memstore.New(memstore.Options{}))
	ctx := context.Background()
	seen := map[bool]bool{}
	for k := 0; len(seen) < 2; k++ {
		v := fmt.Sprintf("u%d", k)
		enforced := keyShare([]byte(key("per-day", v))) < 5000
		require.True(t, p.Check(ctx, &Request{Now: t0, Descs: descs("api_key=" + v), Cost: 1}, nil).Status.Allowed())
		d := p.Check(ctx, &Request{Now: t0, Descs: descs("api_key=" + v), Cost: 1}, nil)
		require.Equal(t, StatusLimited, d.Status)
		if enforced {
			assert.Equal(t, "per-day", d.Rule, "key %s: the longer wait of the enforced day limit", v)
		} else {
			assert.Equal(t, "per-minute", d.Rule, "key %s: the day limit does not enforce it", v)
			assert.LessOrEqual(t, d.Result.RetryAfter, time.Minute)
		}
		seen[enforced] = true
	}
}

// TestRolloutCheckDoesNotAllocate: a warm check of a rule with a regexp
// match and an enforce share allocates no more than one without them.
func TestRolloutCheckDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("under -race, sync.Pool drops the regexps' machines at random")
	}
	ctx := context.Background()
	measure := func(toml string) float64 {
		p := newPolicy(t, toml, memstore.New(memstore.Options{}))
		var sc Scratch
		req := descs("api_key=sk_live_123", "endpoint=/v1/orders/42")
		now := t0
		p.Check(ctx, &Request{Now: now, Descs: req, Cost: 1}, &sc)
		return testing.AllocsPerRun(1000, func() {
			now = now.Add(time.Second)
			p.Check(ctx, &Request{Now: now, Descs: req, Cost: 1}, &sc)
		})
	}
	const rule = "[[rule]]\nname = \"orders\"\nmatch = { endpoint = %q }\nby = [\"api_key\"]\nlimit = 1000\nperiod = \"1s\"\n"
	base := measure(fmt.Sprintf(rule, "/v1/orders/*"))
	assert.LessOrEqual(t, measure(fmt.Sprintf(rule, "~/v1/orders/[0-9]+")+"enforce = \"25%\"\n"), base)
	assert.LessOrEqual(t, measure(fmt.Sprintf(rule, "~/v1/orders/[0-9]+")+"enforce = \"0%\"\n"), base)
}

// TestRegexpInChanges: a glob override and a glob block take "~re" like
// a rule's match; one that does not compile is refused by validation.
func TestRegexpInChanges(t *testing.T) {
	exp := t0.Add(time.Hour)
	ch := &Changes{
		Overrides: []Override{{ID: "o", Rule: "api", Match: map[string]string{"api_key": "~team-[0-9]+"}, Limit: 50, Expires: exp}},
		Blocks:    []Block{{ID: "b", Match: map[string]string{"api_key": "~bad-(a|b)"}, Expires: exp}},
	}
	p := compileChanges(t, changesTOML, ch, newFakeStore())
	assert.Empty(t, p.Orphans())
	assert.Equal(t, 50, admitted(p, t0, 60, "api_key=team-12"), "the override's regexp matches")
	assert.Equal(t, 10, admitted(p, t0, 60, "api_key=team-12x"), "anchored: not a match")
	assert.Equal(t, 0, admitted(p, t0, 5, "api_key=bad-a"), "blocked")
	assert.Equal(t, 10, admitted(p, t0, 60, "api_key=bad-ab"), "anchored: not blocked")
	assert.Error(t, p.ValidateBlock(&Block{Match: map[string]string{"api_key": "~bad-("}, Expires: exp}, t0))
}
