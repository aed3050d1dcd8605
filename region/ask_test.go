package region

import (
	"context"
	"testing"
	"time"

	"github.com/rld/rld/memstore"
	"github.com/rld/rld/redistest"
)

func TestTableMarksARefusedKeyOncePerGap(t *testing.T) {
	r := offline(t)
	now := time.Now()
	m := meta{limit: 900, periodMs: 1000, fallback: 300}
	install(t, r, "k", m, 300, now.Add(time.Minute))
	install2 := func() { // a load keeps the key's mark
		if err := r.table.Install(map[string]string{m.field("k"): formatShare(300, now.Add(time.Minute), 0, 0)}); err != nil {
			t.Fatal(err)
		}
	}
	gap := time.Second
	if !r.table.refused([]byte("k"), 900, now, gap) {
		t.Fatal("first refusal: not marked")
	}
	install2()
	if r.table.refused([]byte("k"), 900, now.Add(gap/2), gap) {
		t.Fatal("marked again within the gap")
	}
	if got := r.table.TakeAsks(); len(got) != 1 || got[0] != m.field("k") {
		t.Fatalf("asks %q, want k's field once", got)
	}
	if got := r.table.TakeAsks(); len(got) != 0 {
		t.Fatalf("asks %q after they were taken, want none", got)
	}
	if !r.table.refused([]byte("k"), 900, now.Add(gap), gap) {
		t.Fatal("not marked again after the gap")
	}
	if r.table.refused([]byte("other"), 900, now, gap) || r.table.refused([]byte("k"), 900, now.Add(2*time.Minute), gap) {
		t.Fatal("a key with no live share was marked: it is renewed at the next pass")
	}
}

func TestBoostRaisesDemandWithinTheLimitOnly(t *testing.T) {
	w := Want{Demand: 100, Limit: 900}
	if got, ok := boost(w, Grant{Share: 120, Demand: 400}, 80); !ok || got.Demand != 240 {
		t.Fatalf("boost = %d (%v), want twice the larger share, 240", got.Demand, ok)
	}
	// The others ask 700 of 900: at most 200 for this region.
	if got, ok := boost(w, Grant{Share: 150, Demand: 800}, 150); !ok || got.Demand != 200 {
		t.Fatalf("boost = %d (%v), want 200: the regions' demand stays within the limit", got.Demand, ok)
	}
	if _, ok := boost(w, Grant{Share: 150, Demand: 901}, 150); ok {
		t.Fatal("boosted while the regions contend for the limit")
	}
	if _, ok := boost(Want{Demand: 400, Limit: 900}, Grant{Share: 150, Demand: 400}, 150); ok {
		t.Fatal("boosted to less than the demand already sent")
	}
}

// TestRefusalAsksTheRenewerForAnEarlyRenewal: a check refused under a
// live share makes the daemon ask its renewer, which renews the key at
// once with its demand raised (between passes 10 s apart), and the
// larger share is installed before the next pass.
func TestRefusalAsksTheRenewerForAnEarlyRenewal(t *testing.T) {
	local := client(t, redistest.Standalone(t).Addr)
	global := client(t, redistest.Standalone(t).Addr)
	ctx := context.Background()
	m := meta{limit: 900, periodMs: 1000, fallback: 300}
	// Demand 100 per period (1000 units over the first pass's interval
	// of 10 s): eu's share is 100 + min(800/3, 25 + 37) = 162 (us and ap
	// hold 300 each).
	if err := local.Do(ctx, local.B().Hincrby().Key(DemandKey).Field(m.field("k")).Increment(1000).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	interval := 10 * time.Second
	r := newRegion(t, "eu", "a", local, global, interval)
	r.Start()
	redistest.WaitFor(t, "the first pass's share and the subscription", func() bool {
		_, ok := r.Table().Get([]byte("k"), 900, time.Now())
		n, err := local.Do(ctx, local.B().PubsubNumsub().Channel(AskChannel).Build()).AsIntMap()
		return ok && r.Stats().Passes >= 1 && err == nil && n[AskChannel] == 1
	})
	// Passes run at each multiple of the interval plus a tenth of it:
	// start when the next one is at least 2 s away.
	redistest.WaitFor(t, "2 s or more before the next pass", func() bool {
		since := time.Since(time.Now().Truncate(interval))
		return since > interval/10+500*time.Millisecond && since < interval-time.Second
	})
	st0 := r.Stats()
	before, ok := r.Table().Get([]byte("k"), 900, time.Now())
	if !ok || before.Units < 1 || before.Units >= 300 {
		t.Fatalf("share before the refusal %+v (live %v), want between 1 and 299", before, ok)
	}
	s := r.Wrap(memstore.New(memstore.Options{}), 900, 0)
	p := tb
	p.Burst = 900
	if res, err := s.Take(ctx, []byte("k"), p, before.Units, time.Now(), false); err != nil || !res.Allowed {
		t.Fatalf("take of the whole share: %+v, %v", res, err)
	}
	if res, err := s.Take(ctx, []byte("k"), p, 1, time.Now(), false); err != nil || res.Allowed {
		t.Fatalf("take beyond the share: %+v, %v; want refused", res, err)
	}
	// Raised to twice the share (162 after the first pass, less after an
	// idle one): a larger share, within the 300 units free (us and ap
	// hold 600).
	redistest.WaitFor(t, "the early renewal's larger share", func() bool {
		sh, ok := r.Table().Get([]byte("k"), 900, time.Now())
		return ok && sh.Units > before.Units && sh.Units <= 300
	})
	if st := r.Stats(); st.EarlyRenewals != st0.EarlyRenewals+1 || st.Passes != st0.Passes {
		t.Fatalf("stats %+v after %+v, want one early renewal and no pass", st, st0)
	}
	sh := shares(t, global, "k")
	if sum := sh["eu"] + sh["us"] + sh["ap"]; sum > 900 {
		t.Fatalf("ledger shares %v sum to %d > 900", sh, sum)
	}
}
