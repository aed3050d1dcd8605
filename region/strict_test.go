package region

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redistest"
)

// strictRig is a region "eu" of three on a real regional Redis, its
// global store reached through a proxy (a 40 ms delay each way).
type strictRig struct {
	r      *Region
	local  rueidis.Client
	global rueidis.Client // direct, for the test's reads
	proxy  *redistest.Proxy
}

func newStrictRig(t *testing.T, interval time.Duration) *strictRig {
	t.Helper()
	gs, ls := redistest.Standalone(t), redistest.Standalone(t)
	p := redistest.StartProxy(t, gs.Addr)
	p.Delay(40 * time.Millisecond)
	rg := &strictRig{local: client(t, ls.Addr), global: client(t, gs.Addr), proxy: p}
	rg.r = newRegion(t, "eu", "d1", rg.local, client(t, p.Addr()), interval)
	return rg
}

// scripts returns the scripts the global store ran (not those it
// refused: an EVALSHA of a script it did not hold).
func (rg *strictRig) scripts(t *testing.T) int64 {
	t.Helper()
	info, err := rg.global.Do(context.Background(), rg.global.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") && !strings.HasPrefix(line, "cmdstat_eval:") {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			name, v, _ := strings.Cut(kv, "=")
			x, _ := strconv.ParseInt(v, 10, 64)
			switch name {
			case "calls":
				n += x
			case "failed_calls", "rejected_calls": // NOSCRIPT: not run
				n -= x
			}
		}
	}
	return n
}

// TestStrictKeyNewToRegionRenewsOnceThenDecides: twenty concurrent
// first checks of a strict key the region holds no share of are all
// admitted on a share renewed on the global store at once, in one
// renewal (coalesced), none on a fallback share; the other regions are
// held at 0 on the ledger, and the share is in the regional hash.
func TestStrictKeyNewToRegionRenewsOnceThenDecides(t *testing.T) {
	rg := newStrictRig(t, 200*time.Millisecond)
	s := rg.r.WrapStrict(memstore.New(memstore.Options{}), 900)
	p := tb
	p.Burst = 0 // the whole share at once: room for the 20 checks
	ctx := context.Background()
	if rs := s.ExplainRegion([]byte("k"), p, time.Now()); !rs.Strict || rs.Live || rs.Units != 0 {
		t.Fatalf("explain before the first check: %+v, want strict, no lease, 0 units", rs)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Take(ctx, []byte("k"), p, 1, time.Now(), false)
			if err == nil && !res.Allowed {
				err = errors.New("refused")
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("first check of a strict key: %v", err)
		}
	}
	if took := time.Since(start); took < 80*time.Millisecond {
		t.Fatalf("first checks answered in %s, less than the global round trip (80 ms): not renewed", took)
	}
	if n := rg.scripts(t); n != 1 {
		t.Fatalf("global store ran %d renew scripts for 20 concurrent first checks, want 1", n)
	}
	st := rg.r.Stats()
	if st.StrictRenewals != 1 || st.Fallbacks != 0 || st.StrictUnanswered != 0 {
		t.Fatalf("stats %+v: want 1 strict renewal, no fallback decision, none unanswered", st)
	}
	sh, live := rg.r.Table().Get([]byte("k"), 900, time.Now())
	if !live || sh.Units < 20 {
		t.Fatalf("share %+v live %v: want a live share of at least the 20 units asked", sh, live)
	}
	led, err := rg.global.Do(ctx, rg.global.B().Hgetall().Key(LedgerKey("k")).Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	if led["s:us"] != "0" || led["s:ap"] != "0" || led["s:eu"] != strconv.FormatInt(sh.Units, 10) {
		t.Fatalf("ledger %v: want eu at %d, us and ap at 0 (no fallback share)", led, sh.Units)
	}
	m := s.metaOf(&tb)
	v, err := rg.local.Do(ctx, rg.local.B().Hget().Key(SharesKey).Field(m.field("k")).Build()).ToString()
	if err != nil {
		t.Fatalf("regional shares hash: %v", err)
	}
	if units, _, err := parseShare(v); err != nil || units != sh.Units {
		t.Fatalf("regional share %q (%v), want %d units", v, err, sh.Units)
	}
	// The next check decides on the share: no more round trips.
	if res, err := s.Take(ctx, []byte("k"), p, 1, time.Now(), false); err != nil || !res.Allowed {
		t.Fatalf("next check: %+v %v", res, err)
	}
	if n := rg.scripts(t); n != 1 {
		t.Fatalf("global store ran %d renew scripts after a check with a live share, want still 1", n)
	}
}

// TestStrictKeyUnansweredFailsWithinTheBound: with the global store
// unreachable (the proxy drops its traffic), a check of a strict key
// with no share fails with ErrGlobalUnanswered within the bound (two
// intervals), not hung; checks while the renewal is still in flight fail
// at once, and no second renewal starts.
func TestStrictKeyUnansweredFailsWithinTheBound(t *testing.T) {
	const interval = 100 * time.Millisecond
	rg := newStrictRig(t, interval)
	s := rg.r.WrapStrict(memstore.New(memstore.Options{}), 900)
	rg.proxy.Blackhole()
	start := time.Now()
	_, err := s.Take(context.Background(), []byte("k"), tb, 1, time.Now(), false)
	took := time.Since(start)
	if !errors.Is(err, ErrGlobalUnanswered) {
		t.Fatalf("take with the global store out of reach: %v, want ErrGlobalUnanswered", err)
	}
	if took < 2*interval || took > 10*interval {
		t.Fatalf("answered in %s, want the bound %s (at most 10 intervals: not hung)", took, 2*interval)
	}
	start = time.Now()
	for range 10 {
		if _, err := s.Take(context.Background(), []byte("k"), tb, 1, time.Now(), false); !errors.Is(err, ErrGlobalUnanswered) {
			t.Fatalf("take while the renewal is in flight: %v", err)
		}
	}
	if took := time.Since(start); took > interval {
		t.Fatalf("10 checks during the renewal in flight took %s, want at once", took)
	}
	if st := rg.r.Stats(); st.StrictUnanswered != 11 || st.StrictRenewals != 0 {
		t.Fatalf("stats %+v: want 11 unanswered, no renewal", st)
	}
}

// TestStrictFailModeDecidesUnanswered: through the policy, a strict key
// with no share and the global store out of reach is refused by a
// fail = "closed" rule, and admitted up to limit / regions by a
// fail = "open" one.
func TestStrictFailModeDecidesUnanswered(t *testing.T) {
	for _, tc := range []struct {
		fail string
		want int
	}{{"closed", 0}, {"open", 300}} {
		t.Run(tc.fail, func(t *testing.T) {
			rg := newStrictRig(t, 100*time.Millisecond)
			rg.proxy.Blackhole()
			fb := policy.NewFallback(policy.FallbackOptions{NewLocal: func() policy.LocalStore { return memstore.New(memstore.Options{}) }})
			p := globalPolicy(t, rg.r, "period = \"1h\"\nglobal_strict = true\nfail = \""+tc.fail+"\"",
				policy.Stores{Cached: memstore.New(memstore.Options{}), Fallback: fb})
			descs := []descriptor.Descriptor{{Name: []byte("api_key"), Value: []byte("a")}}
			admitted := 0
			for range 400 {
				d := p.Check(context.Background(), &policy.Request{Now: time.Now(), Descs: descs, Cost: 1}, nil)
				if d.Status.Allowed() {
					admitted++
				}
			}
			if admitted != tc.want {
				t.Fatalf("fail = %s: admitted %d of 400 with the global store out of reach, want %d", tc.fail, admitted, tc.want)
			}
			if rg.r.Stats().StrictUnanswered == 0 {
				t.Fatal("no unanswered strict check counted")
			}
		})
	}
}

// TestStrictTakeWithShareDoesNotAllocate: a strict rule's take of a key
// with a live share reads the table only: no allocation, no round trip.
func TestStrictTakeWithShareDoesNotAllocate(t *testing.T) {
	r := offline(t)
	s := r.WrapStrict(memstore.New(memstore.Options{}), 900)
	now := time.Now()
	install(t, r, "k", s.metaOf(&tb), 300, now.Add(time.Hour))
	key := []byte("k")
	s.Take(context.Background(), key, tb, 1, now, false) // the inner store's first sight of k
	if n := testing.AllocsPerRun(100, func() { s.Take(context.Background(), key, tb, 1, now, false) }); n != 0 {
		t.Fatalf("strict take with a live share: %.1f allocations, want 0", n)
	}
	if st := r.Stats(); st.StrictRenewals != 0 || st.StrictUnanswered != 0 {
		t.Fatalf("stats %+v: a key with a live share renewed", st)
	}
}

// TestInstallKeepsAStrictShareTheHashLacks: a share a strict renewal put
// in the table survives a load of a shares hash read before its write
// (no entry, or an earlier grant by the global store's stamp, whatever
// its expiry), and gives way to a later grant.
func TestInstallKeepsAStrictShareTheHashLacks(t *testing.T) {
	tab := NewTable()
	m := meta{limit: 900, periodMs: 1000}
	now := time.Now()
	tab.put("k", m, 50, now.Add(time.Minute), 200)
	for _, hash := range []map[string]string{{}, {m.field("k"): formatShare(70, now.Add(2*time.Minute), 0, 100)}} {
		if err := tab.Install(hash); err != nil {
			t.Fatal(err)
		}
		if sh, live := tab.Get([]byte("k"), 900, now); !live || sh.Units != 50 {
			t.Fatalf("after loading %v: share %+v live %v, want the strict renewal's 50", hash, sh, live)
		}
	}
	if err := tab.Install(map[string]string{m.field("k"): formatShare(70, now.Add(time.Second), 0, 300)}); err != nil {
		t.Fatal(err)
	}
	if sh, live := tab.Get([]byte("k"), 900, now); !live || sh.Units != 70 {
		t.Fatalf("after a later renewal: share %+v live %v, want its 70", sh, live)
	}
}

// TestCrossingRenewalsKeepTheLedgersGrant: a strict key's renewal by a
// daemon of the region (d1, whose link to the global store stalls) and
// the renewer's renewal of the same key (its ledger call and write of
// the shares hash) cross: d1's is sent first and reaches the global
// store last. The regional hash then holds the grant the global ledger
// holds (d1's), not the renewer's, though the renewer's expires later
// and was written first.
func TestCrossingRenewalsKeepTheLedgersGrant(t *testing.T) {
	gs, ls := redistest.Standalone(t), redistest.Standalone(t)
	p := redistest.StartProxy(t, gs.Addr)
	local, global := client(t, ls.Addr), client(t, gs.Addr)
	d1 := newRegion(t, "eu", "d1", local, client(t, p.Addr()), time.Hour)
	renewer, err := NewLedger(global, "eu", three, d1.o.Lease)
	if err != nil {
		t.Fatal(err)
	}
	m := meta{limit: 900, periodMs: 1000, fallback: 300}
	ctx := context.Background()
	crossed := 0
	for attempt := range 5 {
		key := "k" + strconv.Itoa(attempt)
		p.Blackhole() // d1's renewal waits in the proxy
		done := make(chan error, 1)
		go func() { done <- d1.renewStrict(ctx, key, m, 1) }()
		// The renewer's, of a demand of 600: answered and written at once.
		w := Want{Key: key, Demand: 600, Limit: m.limit, Fallback: m.fallback, Floor: 30}
		g := renewer.Renew(ctx, []Want{w})[0]
		if g.Err != nil {
			t.Fatal(g.Err)
		}
		if err := putShares(ctx, local, []string{m.field(key), formatShare(g.Share, g.Expiry, w.Demand, g.Stamp)}, nil, time.Now()); err != nil {
			t.Fatal(err)
		}
		p.Heal()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		held, err := global.Do(ctx, global.B().Hget().Key(LedgerKey(key)).Field("s:eu").Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		v, err := local.Do(ctx, local.B().Hget().Key(SharesKey).Field(m.field(key)).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		sv, err := parseShareValue(v)
		if err != nil {
			t.Fatal(err)
		}
		mine, _ := d1.table.Get([]byte(key), m.limit, time.Now())
		t.Logf("attempt %d: renewer's grant %d (stamp %d), strict grant %d, ledger %d, hash %q", attempt, g.Share, g.Stamp, mine.Units, held, v)
		if sv.units != held || sv.stamp <= g.Stamp {
			t.Fatalf("the hash holds %q, the ledger %d: want the later grant (stamp above the renewer's %d), the ledger's", v, held, g.Stamp)
		}
		if mine.Units != held {
			t.Fatalf("d1's table holds %d, the ledger %d", mine.Units, held)
		}
		if mine.Expiry.Before(g.Expiry) {
			crossed++ // d1's was sent first: it expires first
		}
	}
	if crossed == 0 {
		t.Fatal("in no attempt was the strict renewal sent before the renewer's: the crossing was not tested")
	}
	t.Logf("crossed in %d of 5 attempts", crossed)
}

// TestPutSharesKeepsTheLaterGrant: the shares script writes a grant
// unless the hash holds a later one (by stamp; a value without one is
// earlier than any), deletes a share given as gone only if it expired,
// and announces a change only.
func TestPutSharesKeepsTheLaterGrant(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	ctx := context.Background()
	now := time.Now()
	get := func(f string) string {
		v, err := c.Do(ctx, c.B().Hget().Key(SharesKey).Field(f).Build()).ToString()
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatal(err)
		}
		return v
	}
	later, earlier := formatShare(10, now.Add(time.Second), 5, 200), formatShare(99, now.Add(time.Minute), 5, 100)
	old := "7:" + strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10) + ":3" // no stamp
	for _, step := range []struct {
		puts, gone []string
		want       map[string]string
	}{
		{[]string{"a", later, "b", old}, nil, map[string]string{"a": later, "b": old}},
		{[]string{"a", earlier, "b", earlier}, nil, map[string]string{"a": later, "b": earlier}},
		{nil, []string{"a", "b"}, map[string]string{"a": later, "b": earlier}}, // both live
		{[]string{"c", formatShare(1, now.Add(-time.Second), 0, 300)}, nil, map[string]string{"c": formatShare(1, now.Add(-time.Second), 0, 300)}},
		{nil, []string{"c", "x"}, map[string]string{"a": later, "c": ""}}, // c expired; x never was
	} {
		if err := putShares(ctx, c, step.puts, step.gone, now); err != nil {
			t.Fatal(err)
		}
		for f, want := range step.want {
			if got := get(f); got != want {
				t.Fatalf("after puts %q, gone %q: %s = %q, want %q", step.puts, step.gone, f, got, want)
			}
		}
	}
}
