package region

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redistest"
)

// newRegion returns a Region of three on the regional Redis local and the
// global store global, not started.
func newRegion(t testing.TB, name, id string, local, global rueidis.Client, interval time.Duration) *Region {
	t.Helper()
	r, err := New(Options{Region: name, Regions: three, ID: id, Interval: interval, Local: local, Global: global, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// install writes key's share into r's table directly.
func install(t testing.TB, r *Region, key string, m meta, units int64, exp time.Time) {
	t.Helper()
	if err := r.table.Install(map[string]string{m.field(key): formatShare(units, exp, 0, 0)}); err != nil {
		t.Fatal(err)
	}
}

// offline is a Region whose clients are never used: its table is filled
// by hand.
func offline(t testing.TB) *Region {
	s := redistest.Standalone(t)
	c := client(t, s.Addr)
	return newRegion(t, "eu", "d1", c, c, time.Hour)
}

var tb = algo.Params{Kind: algo.TokenBucket, Limit: 900, Period: time.Second, Burst: 90}

func TestStoreScalesParamsToShare(t *testing.T) {
	r := offline(t)
	s := r.Wrap(memstore.New(memstore.Options{}), 900, 0)
	now := time.Now()
	install(t, r, "k", s.metaOf(&tb), 300, now.Add(time.Minute))
	// Burst 90 × 300/900 = 30 units admitted at once, then refused.
	admitted := 0
	for range 100 {
		res, err := s.Take(context.Background(), []byte("k"), tb, 1, now, false)
		if err != nil {
			t.Fatal(err)
		}
		if res.Limit != 90 {
			t.Fatalf("result limit = %d, want the rule's global capacity 90", res.Limit)
		}
		if res.Allowed {
			admitted++
		}
	}
	if admitted != 30 {
		t.Fatalf("admitted %d at once with a share of 300/900 of burst 90, want 30", admitted)
	}
	if st := r.Stats(); st.Fallbacks != 0 {
		t.Fatalf("fallback decisions = %d with a live share", st.Fallbacks)
	}
}

func TestStoreFallsBackAfterExpiry(t *testing.T) {
	r := offline(t)
	s := r.Wrap(memstore.New(memstore.Options{}), 900, 0)
	now := time.Now()
	install(t, r, "k", s.metaOf(&tb), 900, now.Add(-time.Millisecond))
	// Expired: the fallback share, 900/3 = 300 of 900, scales burst to 30.
	admitted := 0
	for range 100 {
		if res, _ := s.Take(context.Background(), []byte("k"), tb, 1, now, false); res.Allowed {
			admitted++
		}
	}
	if admitted != 30 {
		t.Fatalf("admitted %d with an expired share, want the fallback's 30", admitted)
	}
	if st := r.Stats(); st.Fallbacks != 100 {
		t.Fatalf("fallback decisions = %d, want 100", st.Fallbacks)
	}
	// A key with no entry at all falls back too, with the rule's
	// fallback_share when set: 90 of 900 → burst 9.
	s2 := r.Wrap(memstore.New(memstore.Options{}), 900, 90)
	admitted = 0
	for range 100 {
		if res, _ := s2.Take(context.Background(), []byte("new"), tb, 1, now, false); res.Allowed {
			admitted++
		}
	}
	if admitted != 9 {
		t.Fatalf("admitted %d for a new key with fallback_share 90, want 9", admitted)
	}
}

func TestStoreDeniesZeroShare(t *testing.T) {
	r := offline(t)
	s := r.Wrap(memstore.New(memstore.Options{}), 900, 0)
	now := time.Now()
	install(t, r, "k", s.metaOf(&tb), 0, now.Add(time.Minute))
	res, err := s.Take(context.Background(), []byte("k"), tb, 1, now, false)
	if err != nil || res.Allowed || res.RetryAfter != time.Hour {
		t.Fatalf("take with share 0 = %+v, %v; want denied, retry after one interval", res, err)
	}
}

func TestStoreCountsDemand(t *testing.T) {
	r := offline(t)
	s := r.Wrap(memstore.New(memstore.Options{}), 900, 0)
	now := time.Now()
	for range 5 {
		s.Take(context.Background(), []byte("a"), tb, 2, now, false)
		s.Take(context.Background(), []byte("a"), tb, 2, now, true) // peeks ask nothing
	}
	m := s.metaOf(&tb)
	install(t, r, "a", m, 300, now.Add(time.Minute)) // the pending count moves into the entry
	s.Take(context.Background(), []byte("a"), tb, 1, now, false)
	ds := r.table.TakeDemand()
	if len(ds) != 1 || ds[0].Field != m.field("a") || ds[0].Units != 11 {
		t.Fatalf("demand = %+v, want 11 units of %q", ds, m.field("a"))
	}
	if ds := r.table.TakeDemand(); len(ds) != 0 {
		t.Fatalf("demand after a take = %+v, want none", ds)
	}
}

func TestTableLookupDoesNotAllocate(t *testing.T) {
	r := offline(t)
	s := r.Wrap(memstore.New(memstore.Options{}), 900, 0)
	now := time.Now()
	m := s.metaOf(&tb)
	install(t, r, "k", m, 300, now.Add(time.Minute))
	key := []byte("k")
	if n := testing.AllocsPerRun(100, func() { r.table.share(key, &m, now, 1) }); n != 0 {
		t.Fatalf("share lookup of a key with an entry allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { r.table.share([]byte("pending"), &m, now, 1) }); n != 0 {
		t.Fatalf("share lookup of a known pending key allocates %v times", n)
	}
	if n := testing.AllocsPerRun(100, func() { s.Take(context.Background(), key, tb, 1, now, false) }); n != 0 {
		t.Fatalf("a take through the wrapper allocates %v times", n)
	}
}

func TestTableRejectsBadEntries(t *testing.T) {
	tab := NewTable()
	good := meta{limit: 10, periodMs: 1000, fallback: 3}.field("k")
	err := tab.Install(map[string]string{good: "5:99999999999999", "x:k": "5:1", "10:1000:11:k2": "1:1", good + "2": "five"})
	if err == nil {
		t.Fatal("bad entries installed with no error")
	}
	if s, ok := tab.Get([]byte("k"), 10, time.Now()); !ok || s.Units != 5 {
		t.Fatalf("good entry beside bad ones = %+v, %v", s, ok)
	}
	if len(*tab.m.Load()) != 1 {
		t.Fatalf("table holds %d entries, want the good one only", len(*tab.m.Load()))
	}
}

func TestExplainShowsTheRegionalShare(t *testing.T) {
	r := offline(t)
	p := globalPolicy(t, r, "period = \"1s\"\nburst = 90", policy.Stores{Cached: memstore.New(memstore.Options{})})
	descs := []descriptor.Descriptor{{Name: []byte("api_key"), Value: []byte("a")}}
	now := time.Now()
	e := p.Explain(context.Background(), &policy.Request{Now: now, Descs: descs, Cost: 1})
	if rs := e.Rules[0].Region; rs == nil || rs.Live || rs.Units != 300 || rs.Fallback != 300 || rs.Region != "eu" {
		t.Fatalf("explain of a key with no lease: region %+v, want the fallback 300 of eu", rs)
	}
	// A check counts its demand under the counter key's field id.
	p.Check(context.Background(), &policy.Request{Now: now, Descs: descs, Cost: 1}, nil)
	ds := r.table.TakeDemand()
	if len(ds) != 1 {
		t.Fatalf("demand after one check: %+v", ds)
	}
	if err := r.table.Install(map[string]string{ds[0].Field: formatShare(600, now.Add(time.Minute), 1234, 0)}); err != nil {
		t.Fatal(err)
	}
	e = p.Explain(context.Background(), &policy.Request{Now: now, Descs: descs, Cost: 1})
	if rs := e.Rules[0].Region; rs == nil || !rs.Live || rs.Units != 600 || rs.Demand != 1234 || rs.Limit != 900 {
		t.Fatalf("explain of a key with a lease: region %+v, want 600 of 900, demand 1234", rs)
	}
	if e.Rules[0].Result.Limit != 90 {
		t.Fatalf("explain's limit = %d, want the rule's global burst 90", e.Rules[0].Result.Limit)
	}
}

// failing is a store whose every call fails, as a Redis out of reach.
type failing struct{}

var errDown = errors.New("store down")

func (failing) Take(context.Context, []byte, algo.Params, int64, time.Time, bool) (algo.Result, error) {
	return algo.Result{}, errDown
}

func (failing) Refund(context.Context, []byte, algo.Params, int64, time.Time, time.Time) error {
	return errDown
}

// TestFailOpenEnforcesTheShare: when the region's store fails, a global
// rule with fail = "open" is decided by the policy's Fallback with the
// region's share, not the whole global limit.
func TestFailOpenEnforcesTheShare(t *testing.T) {
	r := offline(t)
	fb := policy.NewFallback(policy.FallbackOptions{NewLocal: func() policy.LocalStore { return memstore.New(memstore.Options{}) }})
	p := globalPolicy(t, r, "period = \"1h\"\nfail = \"open\"", policy.Stores{Cached: failing{}, Fallback: fb})
	descs := []descriptor.Descriptor{{Name: []byte("api_key"), Value: []byte("a")}}
	now := time.Now()
	admitted := 0
	for range 1000 {
		if d := p.Check(context.Background(), &policy.Request{Now: now, Descs: descs, Cost: 1}, nil); d.Status.Allowed() {
			admitted++
		}
	}
	// No lease: the fallback share, 900/3 = 300 (one daemon).
	if admitted != 300 {
		t.Fatalf("admitted %d with the store down, want the region's fallback share 300", admitted)
	}
}

// globalPolicy compiles one global rule "g" (limit 900 by api_key, of
// regions eu, us and ap; extra adds its keys) over st, its global store
// r's wrapper.
func globalPolicy(t *testing.T, r *Region, extra string, st policy.Stores) *policy.Policy {
	t.Helper()
	cfg, err := config.Parse([]byte(`
[global]
redis = ["127.0.0.1:1"]
region = "eu"
regions = ["eu", "us", "ap"]

[[rule]]
name = "g"
by = ["api_key"]
limit = 900
scope = "global"
`+extra+"\n"), "g.toml")
	if err != nil {
		t.Fatal(err)
	}
	st.Global = func(cr *config.Rule, inner policy.Store) policy.Store {
		if cr.GlobalStrict {
			return r.WrapStrict(inner, cr.DefaultLimit())
		}
		return r.Wrap(inner, cr.DefaultLimit(), cr.FallbackShare)
	}
	p, err := policy.NewStores(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseShareValue(t *testing.T) {
	for v, want := range map[string]shareValue{
		"5:99":          {units: 5, expMs: 99},
		"5:99:7":        {units: 5, expMs: 99, demand: 7},
		"5:99:7:123456": {units: 5, expMs: 99, demand: 7, stamp: 123456},
		"0:0:0:0":       {},
	} {
		if got, err := parseShareValue(v); err != nil || got != want {
			t.Errorf("parseShareValue(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	for _, v := range []string{"", "5", "5:", ":99", "5:99:7:1:2", "-5:99", "5:-99", "five:99", "5:99:x", "5::7", "5:99:7:"} {
		if got, err := parseShareValue(v); err == nil {
			t.Errorf("parseShareValue(%q) = %+v, want an error", v, got)
		}
	}
}
