package region

import (
	"context"
	"testing"
	"time"

	"github.com/rld/rld/redistest"
)

func TestRenewerElectionTakesOverWhenHolderStops(t *testing.T) {
	s := redistest.Standalone(t)
	c := client(t, s.Addr)
	interval := 50 * time.Millisecond
	a := newRegion(t, "eu", "a", c, c, interval)
	b := newRegion(t, "eu", "b", c, c, interval)
	a.Start()
	redistest.WaitFor(t, "a elected", a.Renewer)
	// b stays out while a holds the role.
	for range 5 {
		b.tick()
		if b.Renewer() {
			t.Fatal("b elected while a holds the role")
		}
	}
	b.Start()
	// Stop a without resigning: its key lapses after 3 intervals.
	a.crash()
	stopped := time.Now()
	redistest.WaitFor(t, "b elected", b.Renewer)
	// The key lapses at most 3 intervals after the crash, and b tries
	// once an interval: 4 intervals, plus scheduling on a loaded host.
	took := time.Since(stopped)
	t.Logf("b took over %s after a stopped (interval %s)", took, interval)
	if took > (renewerTTLIntervals+1)*interval+100*time.Millisecond {
		t.Fatalf("take-over took %s, want within %d intervals", took, renewerTTLIntervals+1)
	}
}

// crash stops r's loop as a killed daemon would stop: without resigning
// the renewer role.
func (r *Region) crash() {
	r.once.Do(func() {
		close(r.stop)
		<-r.done
		if r.subCancel != nil {
			r.subCancel()
			<-r.subDone
		}
		if r.renewer.held {
			renewerG.Add(-1)
		}
	})
}

func TestProjectFollowsTheTrend(t *testing.T) {
	last := map[string]int64{}
	for _, c := range []struct {
		now, noise, want int64
		why              string
	}{
		{100, 0, 100, "first sight: no trend"},
		{150, 0, 250, "rising by 50: two more intervals of it"},
		{100, 0, 50, "falling by 50: two more intervals of it, at least half the measure"},
		{60, 0, 30, "falling fast: at least half the measure"},
		{600, 0, 1680, "jumping: two more intervals of the rise"},
		{0, 0, 0, "idle"},
		{10, 10, 10, "a small key's count moving within the noise: no trend"},
		{20, 10, 20, "up by the noise: no trend"},
		{10, 10, 10, "down by the noise: no trend"},
		{40, 10, 80, "rising by 30: two more intervals of it less the noise"},
		{10, 10, 5, "falling by 30: two more intervals of the fall beyond the noise, at least half the measure"},
		{100, 10, 260, "rising by 90: two more intervals of it less the noise"},
		{80, 10, 60, "falling by 20: two more intervals of it less the noise"},
	} {
		if got := project(c.now, c.noise, last, "f"); got != c.want {
			t.Fatalf("project(%d, %d) = %d, want %d (%s)", c.now, c.noise, got, c.want, c.why)
		}
	}
}

// TestSharesMessageLoadsAtOnce: a daemon installs the shares the
// renewer announces on SharesChannel without waiting for its next tick.
func TestSharesMessageLoadsAtOnce(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	interval := time.Minute // no per-interval load within the test
	ctx := context.Background()
	// Another daemon holds the renewer role: r only loads.
	if err := c.Do(ctx, c.B().Set().Key(RenewerKey).Value("other").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	m := meta{limit: 900, periodMs: 1000, fallback: 300}
	exp := time.Now().Add(interval)
	// k0 is there before the start: its share shows the first tick's load.
	if err := c.Do(ctx, c.B().Hset().Key(SharesKey).FieldValue().FieldValue(m.field("k0"), formatShare(1, exp, 0, 0)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r := newRegion(t, "eu", "a", c, c, interval)
	r.Start()
	redistest.WaitFor(t, "the first tick's load and subscription", func() bool {
		_, ok := r.Table().Get([]byte("k0"), 900, time.Now())
		n, err := c.Do(ctx, c.B().PubsubNumsub().Channel(SharesChannel).Build()).AsIntMap()
		return ok && err == nil && n[SharesChannel] == 1
	})
	// The next tick is a minute away: only a message installs k.
	redistest.WaitFor(t, "the share installed on the message", func() bool {
		if err := c.Do(ctx, c.B().Hset().Key(SharesKey).FieldValue().FieldValue(m.field("k"), formatShare(123, exp, 0, 0)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if err := c.Do(ctx, c.B().Publish().Channel(SharesChannel).Message("1").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		s, ok := r.Table().Get([]byte("k"), 900, time.Now())
		return ok && s.Units == 123
	})
}

// TestPassRenewsACappedKeyAgain: a key whose grant is capped well below
// its target (the other regions hold their first-sight shares) is renewed
// a second time in the same pass, and the live shares stay within L.
func TestPassRenewsACappedKeyAgain(t *testing.T) {
	local := client(t, redistest.Standalone(t).Addr)
	global := client(t, redistest.Standalone(t).Addr)
	r := newRegion(t, "eu", "a", local, global, time.Second)
	m := meta{limit: 900, periodMs: 1000, fallback: 300}
	ctx := context.Background()
	if err := local.Do(ctx, local.B().Hincrby().Key(DemandKey).Field(m.field("k")).Increment(500).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r.tick() // elected; demand 500 per period: target 500 + min(133, 162) = 633, capped at the free 300
	st := r.Stats()
	if st.Passes != 1 || st.Retries != 1 || st.Renewals != 2 {
		t.Fatalf("stats %+v, want one pass, one key renewed twice", st)
	}
	if sh, ok := r.Table().Get([]byte("k"), 900, time.Now()); !ok || sh.Units != 300 {
		t.Fatalf("share %+v (live %v), want 300: nothing else is free", sh, ok)
	}
	s := shares(t, global, "k")
	if sum := s["eu"] + s["us"] + s["ap"]; sum > 900 {
		t.Fatalf("ledger shares %v sum to %d > 900", s, sum)
	}
}

// TestTickSkipsTheLoadAMessageMade: while the renewer publishes every
// interval, a daemon loads the shares hash once an interval, on the
// message, and skips its tick's load, which would read the same hash;
// when the messages stop (no more demand), its ticks load again.
func TestTickSkipsTheLoadAMessageMade(t *testing.T) {
	local := client(t, redistest.Standalone(t).Addr)
	global := client(t, redistest.Standalone(t).Addr)
	const interval = 100 * time.Millisecond
	a := newRegion(t, "eu", "a", local, global, interval)
	a.Start()
	redistest.WaitFor(t, "a to hold the renewer role", a.Renewer)
	b := newRegion(t, "eu", "b", local, global, interval)
	b.Start()
	m := meta{limit: 900, periodMs: 1000, fallback: 300}
	ctx := context.Background()
	stop := make(chan struct{})
	demandDone := make(chan struct{})
	go func() { // the daemons' flushes: demand in every interval
		defer close(demandDone)
		t := time.NewTicker(interval / 4)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				local.Do(ctx, local.B().Hincrby().Key(DemandKey).Field(m.field("k")).Increment(10).Build())
			}
		}
	}()
	redistest.WaitFor(t, "b to load k's share on a message", func() bool {
		_, ok := b.Table().Get([]byte("k"), 900, time.Now())
		return ok && b.Stats().SkippedLoads > 0
	})
	a0, b0 := a.Stats(), b.Stats()
	redistest.WaitFor(t, "20 passes", func() bool { return a.Stats().Passes-a0.Passes >= 20 })
	a1, b1 := a.Stats(), b.Stats()
	passes, loads, skipped := a1.Passes-a0.Passes, b1.Loads-b0.Loads, b1.SkippedLoads-b0.SkippedLoads
	t.Logf("%d passes: b loaded %d times and skipped %d ticks' loads", passes, loads, skipped)
	// Without the skip: two loads a pass (the message's, the tick's).
	if 2*loads > 3*passes || 2*skipped < passes {
		t.Fatalf("%d passes: b loaded %d times, skipped %d; want about one load and one skip a pass", passes, loads, skipped)
	}

	close(stop)
	<-demandDone
	// No demand: the share is renewed idle once, then expires, and the
	// renewer publishes nothing more: b's ticks load again (five in a
	// row with no skip).
	l0, s0 := b.Stats().Loads, b.Stats().SkippedLoads
	redistest.WaitFor(t, "b's ticks to load with no message", func() bool {
		st := b.Stats()
		if st.SkippedLoads != s0 {
			l0, s0 = st.Loads, st.SkippedLoads
			return false
		}
		return st.Loads-l0 >= 5
	})
}
