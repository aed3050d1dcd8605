package policy

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/memstore"
)

const concurrencyRules = `
[[rule]]
name = "exports"
algorithm = "concurrency"
match = { endpoint = "/v1/export" }
by = ["api_key"]
limit = 2
timeout = "30s"

[[rule]]
name = "per-key"
by = ["api_key"]
limit = 5
period = "1m"
`

// TestAcquirePeekIsRefused: an acquire whose Request peeks is an error
// (CodeMalformed, ErrAcquirePeek), on both acquire paths, and takes
// nothing: the limits stay whole.
func TestAcquirePeekIsRefused(t *testing.T) {
	p := newPolicy(t, concurrencyRules, memstore.New(memstore.Options{}))
	ctx := context.Background()
	var sc Scratch
	var d Decision
	export := descs("api_key=k", "endpoint=/v1/export")
	req := &Request{Now: t0, Descs: export, Cost: 1, Peek: true}

	lease := p.AcquireTo(ctx, req, &sc, &d)
	assert.Nil(t, lease)
	assert.Equal(t, StatusError, d.Status)
	assert.Equal(t, CodeMalformed, d.Code)
	assert.ErrorIs(t, d.Err, ErrAcquirePeek)

	d = Decision{}
	lease, ok := p.TryAcquireTo(ctx, req, &sc, &d)
	assert.True(t, ok, "decided: nothing to hand off")
	assert.Nil(t, lease)
	assert.Equal(t, CodeMalformed, d.Code)
	assert.ErrorIs(t, d.Err, ErrAcquirePeek)

	// Both slots and all 5 units are still there.
	for i := range 2 {
		lease = p.AcquireTo(ctx, &Request{Now: t0, Descs: export, Cost: 1}, &sc, &d)
		require.Equal(t, StatusAllowed, d.Status, "acquire %d", i)
		require.NotEmpty(t, lease)
	}
	d = p.Check(ctx, &Request{Now: t0, Descs: descs("api_key=k"), Cost: 3}, &sc)
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, int64(0), d.Result.Remaining, "5 - 2 acquires - 3")
}

// TestAcquireRelease: an acquire holds a slot until it is released or its
// timeout passes; a check looks for a free slot and holds none; a denial
// by another rule releases what the acquire took.
func TestAcquireRelease(t *testing.T) {
	p := newPolicy(t, concurrencyRules, memstore.New(memstore.Options{}))
	ctx := context.Background()
	var sc Scratch
	var d Decision
	export := descs("api_key=k", "endpoint=/v1/export")
	acquire := func(now time.Time) (Decision, string) {
		t.Helper()
		lease := p.AcquireTo(ctx, &Request{Now: now, Descs: export, Cost: 1}, &sc, &d)
		return d, string(lease)
	}

	d1, l1 := acquire(t0)
	require.Equal(t, StatusAllowed, d1.Status)
	require.NotEmpty(t, l1)
	// A check finds the second slot free, and holds none.
	d = p.Check(ctx, &Request{Now: t0, Descs: export, Cost: 1}, &sc)
	require.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "exports", d.Rule)
	assert.Equal(t, int64(0), d.Result.Remaining, "a check sees one slot left, and that it would take it")
	d2, l2 := acquire(t0.Add(time.Millisecond))
	require.Equal(t, StatusAllowed, d2.Status)
	assert.NotEqual(t, l1, l2)

	d3, l3 := acquire(t0.Add(2 * time.Millisecond))
	assert.Equal(t, StatusLimited, d3.Status)
	assert.Equal(t, "exports", d3.Rule)
	assert.Equal(t, 30*time.Second-2*time.Millisecond, d3.Result.RetryAfter, "the oldest slot expires then")
	assert.Empty(t, l3)

	r := p.Release(ctx, t0.Add(3*time.Millisecond), []byte(l1))
	require.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
	assert.Equal(t, "exports", r.Rule)
	r = p.Release(ctx, t0.Add(3*time.Millisecond), []byte(l1))
	assert.Equal(t, StatusError, r.Status)
	assert.Equal(t, CodeNotFound, r.Code)
	assert.ErrorIs(t, r.Err, ErrUnknownLease)

	// The per-key rate rule has 5 − 2 (acquires) − 1 (check) = 2 left;
	// then it denies, and the slot the acquire took goes back.
	d4, l4 := acquire(t0.Add(4 * time.Millisecond))
	require.Equal(t, StatusAllowed, d4.Status)
	d = p.Check(ctx, &Request{Now: t0.Add(4 * time.Millisecond), Descs: descs("api_key=k"), Cost: 1}, &sc)
	require.Equal(t, StatusAllowed, d.Status)
	d5, l5 := acquire(t0.Add(5 * time.Millisecond))
	assert.Equal(t, StatusLimited, d5.Status)
	assert.Equal(t, "exports", d5.Rule, "both slots are held")
	r = p.Release(ctx, t0.Add(6*time.Millisecond), []byte(l4))
	require.Equal(t, StatusAllowed, r.Status)
	d6, l6 := acquire(t0.Add(7 * time.Millisecond))
	assert.Equal(t, StatusLimited, d6.Status)
	assert.Equal(t, "per-key", d6.Rule)
	assert.Empty(t, l5+l6)
	d = p.Check(ctx, &Request{Now: t0.Add(7 * time.Millisecond), Descs: export, Cost: 1, Peek: true}, &sc)
	assert.Equal(t, "per-key", d.Rule, "the slot the denied acquire took was released")

	// The slot of l2 expires at its timeout: then it is unknown.
	r = p.Release(ctx, time.UnixMicro(d2.Result.At).Add(30*time.Second), []byte(l2))
	assert.Equal(t, CodeNotFound, r.Code)

	for _, bad := range []string{"", "!!", "AQ", "AgE", l1 + "x", l1[:len(l1)-2]} {
		r = p.Release(ctx, t0, []byte(bad))
		assert.Equal(t, CodeMalformed, r.Code, "%q", bad)
		assert.ErrorIs(t, r.Err, ErrBadLease)
	}
}

// TestAcquireWithoutConcurrencyRule: an acquire that no concurrency rule
// counts is a check whose lease names the units it took: releasing it
// holds nothing to give back.
func TestAcquireWithoutConcurrencyRule(t *testing.T) {
	p := newPolicy(t, concurrencyRules, memstore.New(memstore.Options{}))
	var sc Scratch
	var d Decision
	lease := p.AcquireTo(context.Background(), &Request{Now: t0, Descs: descs("api_key=k"), Cost: 1}, &sc, &d)
	assert.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, "per-key", d.Rule)
	require.NotEmpty(t, lease)
	r := p.Release(context.Background(), t0, lease)
	assert.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
	assert.Equal(t, RuleNone, r.Rule)

	// The allow list decides without counting: nothing to name.
	p = newPolicy(t, "allow = [\"api_key=ok\"]\n"+concurrencyRules, memstore.New(memstore.Options{}))
	assert.Nil(t, p.AcquireTo(context.Background(), &Request{Now: t0, Descs: descs("api_key=ok", "endpoint=/v1/export"), Cost: 1}, &sc, &d))
}

const settleRules = `
[[rule]]
name = "tokens"
match = { endpoint = "/v1/chat" }
by = ["api_key"]
limit = 100
period = "1h"

[[rule]]
name = "exports"
algorithm = "concurrency"
match = { endpoint = "/v1/chat", slot = "yes" }
by = ["api_key"]
limit = 1
timeout = "1m"
`

// TestSettle: an acquire at an estimate, settled at the actual cost,
// charges or refunds the difference, once; a charge may put the key in
// debt.
func TestSettle(t *testing.T) {
	for _, kind := range []string{"token_bucket", "gcra", "fixed_window", "sliding_counter", "sliding_log"} {
		t.Run(kind, func(t *testing.T) {
			p := newPolicy(t, strings.Replace(settleRules, `period = "1h"`, `period = "1h"`+"\nalgorithm = \""+kind+"\"", 1), memstore.New(memstore.Options{}))
			ctx := context.Background()
			var sc Scratch
			var d Decision
			chat := descs("api_key=k", "endpoint=/v1/chat", "slot=yes")
			remaining := func(at time.Time) int64 {
				t.Helper()
				d := p.Check(ctx, &Request{Now: at, Descs: descs("api_key=k", "endpoint=/v1/chat"), Cost: 1, Peek: true}, &sc)
				require.Equal(t, "tokens", d.Rule)
				return d.Result.Remaining + 1 // a peek counts the unit it asks for
			}
			now := t0.Add(time.Minute)
			lease := string(p.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 10}, &sc, &d))
			require.Equal(t, StatusAllowed, d.Status)
			assert.Equal(t, int64(90), remaining(now))
			r := p.Settle(ctx, now, []byte(lease), 25)
			require.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
			assert.Equal(t, int64(75), remaining(now), "charged 15 more")
			r = p.Settle(ctx, now, []byte(lease), 1)
			assert.Equal(t, CodeNotFound, r.Code, "settled once")
			assert.Equal(t, int64(75), remaining(now))
			r = p.Release(ctx, now, []byte(lease))
			assert.Equal(t, CodeNotFound, r.Code, "released with its settle")

			lease = string(p.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 10}, &sc, &d))
			require.Equal(t, StatusAllowed, d.Status, "the settle released the slot")
			r = p.Settle(ctx, now, []byte(lease), 4)
			require.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
			assert.Equal(t, int64(71), remaining(now), "refunded 6")

			// At the estimate: nothing to correct, the slot back, and
			// settled: a later settle at another cost is refused.
			lease = string(p.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 10}, &sc, &d))
			require.Equal(t, StatusAllowed, d.Status)
			r = p.Settle(ctx, now, []byte(lease), 10)
			require.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
			assert.Equal(t, int64(61), remaining(now), "the estimate stays")
			r = p.Settle(ctx, now, []byte(lease), 50)
			assert.Equal(t, CodeNotFound, r.Code, "settled once")
			assert.Equal(t, int64(61), remaining(now))
			lease = string(p.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 1}, &sc, &d))
			require.Equal(t, StatusAllowed, d.Status, "the settle released the slot")
			require.Equal(t, StatusAllowed, p.Release(ctx, now, []byte(lease)).Status)

			// Into debt: later checks are refused.
			lease = string(p.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 1}, &sc, &d))
			r = p.Settle(ctx, now, []byte(lease), 100)
			require.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
			d = p.Check(ctx, &Request{Now: now, Descs: descs("api_key=k", "endpoint=/v1/chat"), Cost: 1}, &sc)
			assert.Equal(t, StatusLimited, d.Status)
			assert.Positive(t, d.Result.RetryAfter)

			// Too old, or signed by another key: unknown, nothing changes.
			lease = string(p.AcquireTo(ctx, &Request{Now: now.Add(time.Hour), Descs: descs("api_key=j", "endpoint=/v1/chat", "slot=yes"), Cost: 1}, &sc, &d))
			r = p.Settle(ctx, now.Add(2*time.Hour+time.Second), []byte(lease), 50)
			assert.Equal(t, CodeNotFound, r.Code)
			other := newPolicy(t, settleRules, memstore.New(memstore.Options{}))
			other.stores.LeaseKey = []byte("another fleet's lease key")
			r = other.Settle(ctx, now.Add(time.Hour), []byte(lease), 50)
			assert.Equal(t, CodeNotFound, r.Code)
			assert.ErrorIs(t, r.Err, ErrUnknownLease)
		})
	}
}

// BenchmarkAcquireRelease: an acquire of a concurrency and a rate rule on
// the embedded store, and its release.
func BenchmarkAcquireRelease(b *testing.B) {
	rules := strings.Replace(settleRules, "limit = 100\nperiod = \"1h\"", "limit = 1000000000\nperiod = \"1s\"", 1)
	p := newPolicy(b, rules, memstore.New(memstore.Options{}))
	ctx := context.Background()
	var sc Scratch
	var d Decision
	chat := descs("api_key=k", "endpoint=/v1/chat", "slot=yes")
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		lease := p.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 1}, &sc, &d)
		if d.Status != StatusAllowed {
			b.Fatalf("%+v", d)
		}
		if r := p.Release(ctx, now, lease); r.Status != StatusAllowed {
			b.Fatalf("%+v", r)
		}
	}
}

// FuzzParseLease: the lease decoder never panics on any input, and a
// lease it accepts re-encodes to its own bytes' meaning: what AcquireTo
// gives parses, signed; one byte changed is refused or unsigned.
func FuzzParseLease(f *testing.F) {
	p := newPolicy(f, settleRules, memstore.New(memstore.Options{}))
	var sc Scratch
	var d Decision
	good := string(p.AcquireTo(context.Background(), &Request{Now: t0, Descs: descs("api_key=k", "endpoint=/v1/chat", "slot=yes"), Cost: 3}, &sc, &d))
	f.Add(good)
	f.Add(good[:len(good)-3])
	f.Add("")
	f.Add("AgEC")
	f.Add("Ag" + strings.Repeat("_", 60))
	key := p.leaseKey()
	f.Fuzz(func(t *testing.T, lease string) {
		pl, err := parseLease([]byte(lease), key)
		if err != nil {
			if !errors.Is(err, ErrBadLease) {
				t.Fatalf("error %v is not ErrBadLease", err)
			}
			return
		}
		if len(pl.entries) == 0 || pl.cost < 1 {
			t.Fatalf("accepted a lease of nothing: %+v", pl)
		}
		for _, e := range pl.entries {
			if len(e.key) == 0 {
				t.Fatalf("accepted an empty key")
			}
		}
		if pl.signed && lease != good {
			t.Fatalf("a lease other than the one signed is signed: %q", lease)
		}
	})
}

// TestReleaseSettleAnswers: the answer of a release is the slots free
// after it, with no next (a concurrency limit gives one only with a
// refusal); that of a settle of a lease without slots is the rate
// limit's, with its own next, not a refusal's 0.
func TestReleaseSettleAnswers(t *testing.T) {
	p := newPolicy(t, concurrencyRules, memstore.New(memstore.Options{}))
	ctx := context.Background()
	var sc Scratch
	var d Decision
	lease := p.AcquireTo(ctx, &Request{Now: t0, Descs: descs("api_key=k", "endpoint=/v1/export"), Cost: 1}, &sc, &d)
	require.Equal(t, StatusAllowed, d.Status)
	assert.Equal(t, int64(1), d.Result.Remaining, "one slot of two left")
	r := p.Release(ctx, t0.Add(time.Millisecond), lease)
	require.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
	assert.Equal(t, "exports", r.Rule)
	assert.Equal(t, int64(2), r.Result.Remaining, "both slots are free")
	assert.Zero(t, r.Result.Reset, "no slot held: nothing to wait for")
	assert.Equal(t, time.Duration(-1), algo.Next(r.Params, &r.Result), "no next without a refusal")

	// A lease of the rate rule alone (no slot): 5 a minute, 3 taken.
	lease = p.AcquireTo(ctx, &Request{Now: t0, Descs: descs("api_key=j"), Cost: 3}, &sc, &d)
	require.Equal(t, StatusAllowed, d.Status)
	s := p.Settle(ctx, t0.Add(time.Second), lease, 2)
	require.Equal(t, StatusAllowed, s.Status, "%v", s.Err)
	assert.Equal(t, "per-key", s.Rule)
	assert.Positive(t, algo.Next(s.Params, &s.Result), "the time until the next unit comes back")
	peek := p.Check(ctx, &Request{Now: t0.Add(time.Second), Descs: descs("api_key=j"), Cost: 1, Peek: true}, &sc)
	assert.Equal(t, algo.Next(peek.Params, &peek.Result), algo.Next(s.Params, &s.Result), "the next of a check made then")
}

// TestReleaseUnderKeyOverride: a release answers under the limit in force
// for its key, a key override's: limit 5, four slots held, one released,
// two free.
func TestReleaseUnderKeyOverride(t *testing.T) {
	exp := t0.Add(time.Hour)
	cfg, err := config.Parse([]byte(concurrencyRules), t.Name()+".toml")
	require.NoError(t, err)
	p, err := Compile(cfg, &Changes{Overrides: []Override{
		{ID: "o", Rule: "exports", Key: map[string]string{"api_key": "big"}, Limit: 5, Expires: exp},
	}}, Stores{Cached: memstore.New(memstore.Options{})})
	require.NoError(t, err)
	ctx := context.Background()
	var sc Scratch
	var d Decision
	var leases [][]byte
	for i := range 4 {
		l := p.AcquireTo(ctx, &Request{Now: t0.Add(time.Duration(i) * time.Millisecond), Descs: descs("api_key=big", "endpoint=/v1/export"), Cost: 1}, &sc, &d)
		require.Equal(t, StatusAllowed, d.Status, "acquire %d: %s %v", i, d.Rule, d.Err)
		leases = append(leases, l)
	}
	r := p.Release(ctx, t0.Add(10*time.Millisecond), leases[0])
	require.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
	assert.Equal(t, "exports", r.Rule)
	assert.Equal(t, int64(5), r.Result.Limit, "the override's limit")
	assert.Equal(t, int64(2), r.Result.Remaining, "5 slots, 3 held")
}

// failingOps is the embedded store whose ops fail while fail is set: a
// store that a settle reaches and that fails.
type failingOps struct {
	*memstore.Store
	fail atomic.Bool
}

var errOpsDown = errors.New("ops down")

func (s *failingOps) Do(ctx context.Context, ops []algo.Op, now time.Time) error {
	if s.fail.Load() {
		return errOpsDown
	}
	return s.Store.Do(ctx, ops, now)
}

// TestSettleStoreFailure: a settle whose store fails is an internal
// error by the rule, wrapping the store's error, and changes nothing; the
// lease is not marked settled, so that the same settle succeeds once the
// store is back, and charges once.
func TestSettleStoreFailure(t *testing.T) {
	st := &failingOps{Store: memstore.New(memstore.Options{})}
	p := newPolicy(t, settleRules, st)
	ctx := context.Background()
	var sc Scratch
	var d Decision
	remaining := func() int64 {
		t.Helper()
		d := p.Check(ctx, &Request{Now: t0, Descs: descs("api_key=k", "endpoint=/v1/chat"), Cost: 1, Peek: true}, &sc)
		return d.Result.Remaining + 1
	}
	lease := p.AcquireTo(ctx, &Request{Now: t0, Descs: descs("api_key=k", "endpoint=/v1/chat"), Cost: 10}, &sc, &d)
	require.Equal(t, StatusAllowed, d.Status)
	lease = []byte(string(lease))
	require.Equal(t, int64(90), remaining())

	st.fail.Store(true)
	errorsBefore := p.rules[0].m[decError].Get()
	r := p.Settle(ctx, t0, lease, 30)
	assert.Equal(t, StatusError, r.Status)
	assert.Equal(t, CodeInternal, r.Code)
	assert.Equal(t, "tokens", r.Rule)
	assert.ErrorIs(t, r.Err, errOpsDown)
	assert.Equal(t, errorsBefore+1, p.rules[0].m[decError].Get(), "counted as the rule's error")
	st.fail.Store(false)
	assert.Equal(t, int64(90), remaining(), "nothing changed")

	r = p.Settle(ctx, t0, lease, 30)
	require.Equal(t, StatusAllowed, r.Status, "tried again: %v", r.Err)
	assert.Equal(t, int64(70), remaining(), "charged 20 once")
	r = p.Settle(ctx, t0, lease, 30)
	assert.Equal(t, CodeNotFound, r.Code, "settled once")
}

// TestLeasesShared: the Policies compiled over one Stores share its
// Leases: a lease acquired through one is verified and settled once
// through another (a reload), with no key of its own; Policies with
// Leases of their own share nothing, neither a key nor a settle record.
func TestLeasesShared(t *testing.T) {
	cfg, err := config.Parse([]byte(settleRules), "leases.toml")
	require.NoError(t, err)
	ctx := context.Background()
	st := Stores{Cached: memstore.New(memstore.Options{}), Leases: NewLeases()}
	compile := func(st Stores) *Policy {
		t.Helper()
		p, err := Compile(cfg, nil, st)
		require.NoError(t, err)
		return p
	}
	before, after := compile(st), compile(st)
	var sc Scratch
	var d Decision
	now := t0.Add(time.Minute)
	chat := descs("api_key=k", "endpoint=/v1/chat", "slot=yes")
	lease := before.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 10}, &sc, &d)
	require.Equal(t, StatusAllowed, d.Status)
	r := after.Settle(ctx, now, lease, 4)
	require.Equal(t, StatusAllowed, r.Status, "the reloaded Policy verifies the lease: %v", r.Err)
	r = before.Settle(ctx, now, lease, 4)
	assert.Equal(t, CodeNotFound, r.Code, "settled once, through either")
	assert.ErrorIs(t, r.Err, ErrUnknownLease)

	st.Leases = nil // each Policy its own: a random key each
	own, other := compile(st), compile(st)
	lease = own.AcquireTo(ctx, &Request{Now: now, Descs: chat, Cost: 10}, &sc, &d)
	require.Equal(t, StatusAllowed, d.Status)
	r = other.Settle(ctx, now, lease, 4)
	assert.Equal(t, CodeNotFound, r.Code, "not signed with the other Policy's key")
	r = own.Settle(ctx, now, lease, 4)
	assert.Equal(t, StatusAllowed, r.Status, "%v", r.Err)
}
