package region

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/redistest"
)

// client returns a client of the Redis at addr, closed when t ends.
func client(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := Dial(DialOptions{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var three = []string{"eu", "us", "ap"}

func ledger(t testing.TB, c rueidis.Client, region string, lease time.Duration) *Ledger {
	t.Helper()
	l, err := NewLedger(c, region, three, lease)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// renew renews one key with demand d of limit 900, fallback 300, floor 30.
func renew(t testing.TB, l *Ledger, key string, d int64) Grant {
	t.Helper()
	g := l.Renew(context.Background(), []Want{{Key: key, Demand: d, Limit: 900, Fallback: 300, Floor: 30}})[0]
	if g.Err != nil {
		t.Fatal(g.Err)
	}
	return g
}

// shares reads the live shares of key's ledger, by region.
func shares(t testing.TB, c rueidis.Client, key string) map[string]int64 {
	t.Helper()
	m, err := c.Do(context.Background(), c.B().Hgetall().Key(LedgerKey(key)).Build()).AsIntMap()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, r := range three {
		out[r] = m["s:"+r]
	}
	return out
}

func TestLedgerFirstSightHoldsEveryRegionAtFallback(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	// eu asks for more than its fallback: the others are assumed to hold
	// theirs, so nothing more is free.
	g := renew(t, ledger(t, c, "eu", time.Minute), "k", 800)
	if g.Share != 300 {
		t.Fatalf("first renewal's share = %d, want the fallback 300 (nothing else free)", g.Share)
	}
	if s := shares(t, c, "k"); s["us"] != 300 || s["ap"] != 300 {
		t.Fatalf("ledger after first sight = %v, want us and ap at 300", s)
	}
	if left := time.Until(g.Expiry); left <= 0 || left > time.Minute {
		t.Fatalf("expiry in %s, want within the lease", left)
	}
}

func TestLedgerProportionalTargetsAndDecreaseAtOnce(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	eu, us, ap := ledger(t, c, "eu", time.Minute), ledger(t, c, "us", time.Minute), ledger(t, c, "ap", time.Minute)
	// Under the limit: demand plus an even part of the slack among the
	// live regions, at most demand/4 + m/4 (m = L/2R = 150). eu, idle:
	// 0 + min(900/3, 37) = 37, a decrease at once.
	if g := renew(t, eu, "k", 0); g.Share != 37 {
		t.Fatalf("eu idle share = %d, want 37", g.Share)
	}
	// us asks 600: 600 + min(300/3, 150 + 37) = 700, capped by what is
	// free: 900 - 37 (eu) - 300 (ap, not yet lowered) = 563.
	if g := renew(t, us, "k", 600); g.Share != 563 || g.Target != 700 || g.Demand != 600 {
		t.Fatalf("us share = %d (target %d, demand %d), want 563 (target 700, capped by free units; demand 600)", g.Share, g.Target, g.Demand)
	}
	// ap, idle, decreases at once: 0 + min(300/3, 37) = 37.
	if g := renew(t, ap, "k", 0); g.Share != 37 {
		t.Fatalf("ap idle share = %d, want 37", g.Share)
	}
	// us grows into the units ap returned: its target 700.
	if g := renew(t, us, "k", 600); g.Share != 700 {
		t.Fatalf("us share = %d, want 700", g.Share)
	}
	// eu asks 300: no slack left (300 + 600 = 900), target 300, capped by
	// free = 900 - 700 - 37 = 163.
	if g := renew(t, eu, "k", 300); g.Share != 163 {
		t.Fatalf("eu share = %d, want 163", g.Share)
	}
	// Over the limit: proportional, with a floor. us asks 2700, eu 300.
	if g := renew(t, us, "k", 2700); g.Demand != 3000 { // 900*2700/3000 = 810, capped by free
		t.Fatalf("regions' demand = %d, want 3000", g.Demand)
	}
	if g := renew(t, eu, "k", 300); g.Share != 90 {
		t.Fatalf("eu share under contention = %d, want 900*300/3000 = 90", g.Share)
	}
	if g := renew(t, ap, "k", 0); g.Share != 30 {
		t.Fatalf("idle ap share under contention = %d, want the floor 30", g.Share)
	}
	if g := renew(t, us, "k", 2700); g.Share != 780 {
		t.Fatalf("us share = %d, want 900 - 90 - 30 = 780 (its target 810 capped by free)", g.Share)
	}
}

func TestLedgerIncreaseCappedByFreeUnits(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	eu, us := ledger(t, c, "eu", time.Minute), ledger(t, c, "us", time.Minute)
	renew(t, eu, "k", 5000) // first sight: eu keeps its 300, nothing more is free
	// us wants everything; eu and ap hold 300 each: 300 is free.
	if g := renew(t, us, "k", 5000); g.Share != 300 {
		t.Fatalf("us share = %d, want 300", g.Share)
	}
	for r, s := range shares(t, c, "k") {
		if s > 300 {
			t.Fatalf("region %s holds %d > 300 before anyone lowered", r, s)
		}
	}
}

func TestLedgerReclaimsExpiredShares(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	lease := 300 * time.Millisecond
	eu, us := ledger(t, c, "eu", lease), ledger(t, c, "us", time.Minute)
	renew(t, eu, "k", 100)
	// Wait until eu's and ap's leases (lease from first sight) expire:
	// their lease end is the ledger's, polled through its fields.
	deadline := time.Now().Add(5 * time.Second)
	var g Grant
	for {
		g = renew(t, us, "k", 5000)
		if g.Reclaimed > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// eu's first renewal (demand 100) lowered it to 100 + 100/4 + 150/4.
	if g.Reclaimed != 162+300 {
		t.Fatalf("reclaimed %d, want eu's 162 and ap's 300", g.Reclaimed)
	}
	if g.Share != 900 {
		t.Fatalf("us share after the others expired = %d, want 900", g.Share)
	}
	// Reclaimed once only.
	if g := renew(t, us, "k", 5000); g.Reclaimed != 0 {
		t.Fatalf("second renewal reclaimed %d again", g.Reclaimed)
	}
	// eu comes back: nothing free until us lowers.
	if g := renew(t, eu, "k", 5000); g.Share != 0 {
		t.Fatalf("eu share while us holds everything = %d, want 0", g.Share)
	}
}

// TestLedgerLiveSharesNeverExceedLimit renews random demands from three
// regions in random order, some with short leases, and checks after each
// renewal that the live shares sum to at most the limit.
func TestLedgerLiveSharesNeverExceedLimit(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	rng := rand.New(rand.NewPCG(1, 2))
	leases := []time.Duration{20 * time.Millisecond, time.Second, 40 * time.Millisecond}
	ls := make([]*Ledger, 3)
	for i, r := range three {
		ls[i] = ledger(t, c, r, leases[i])
	}
	for step := range 600 {
		i := rng.IntN(3)
		d := []int64{0, 10, 300, 900, 5000}[rng.IntN(5)]
		renew(t, ls[i], "k", d)
		if step%7 == 0 {
			time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
		}
		// Live shares, judged by the ledger's own clock.
		live, err := c.Do(context.Background(), c.B().Eval().Script(liveSum).Numkeys(1).Key(LedgerKey("k")).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if live > 900 {
			t.Fatalf("step %d: live shares sum to %d > 900", step, live)
		}
	}
}

// liveSum sums the shares of a ledger whose lease has not expired.
const liveSum = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HGETALL', KEYS[1])
local m = {}
for i = 1, #h, 2 do m[h[i]] = tonumber(h[i+1]) end
local sum = 0
for f, v in pairs(m) do
  if string.sub(f, 1, 2) == 's:' and m['e:' .. string.sub(f, 3)] > now then sum = sum + v end
end
return sum`

func TestLedgerReloadsLostScript(t *testing.T) {
	s := redistest.Standalone(t)
	c := client(t, s.Addr)
	l := ledger(t, c, "eu", time.Minute)
	renew(t, l, "k", 1)
	if err := c.Do(context.Background(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if g := renew(t, l, "k", 1); g.Share <= 0 {
		t.Fatalf("share after SCRIPT FLUSH = %d", g.Share)
	}
}

func TestLedgerSplitsSlackAmongLiveRegions(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	lease := 300 * time.Millisecond
	us, ap := ledger(t, c, "us", lease), ledger(t, c, "ap", lease)
	renew(t, us, "k", 0) // first sight: eu, us, ap at 300 until now + lease
	// Once eu's first-sight lease has expired (us and ap renew on), the
	// slack is split between us and ap only.
	deadline := time.Now().Add(5 * time.Second)
	var reclaimed int64
	for reclaimed == 0 && time.Now().Before(deadline) {
		reclaimed = renew(t, ap, "k", 300).Reclaimed + renew(t, us, "k", 400).Reclaimed
		time.Sleep(20 * time.Millisecond)
	}
	if reclaimed != 300 {
		t.Fatalf("reclaimed %d, want eu's 300", reclaimed)
	}
	// The slack 200 split evenly between the two live regions: ap 400,
	// us 500 (with eu counted live: 366 and 466; headroom caps 112, 137).
	ga := renew(t, ap, "k", 300)
	gu := renew(t, us, "k", 400)
	if ga.Share != 400 || gu.Share != 500 {
		t.Fatalf("us %d, ap %d, want 500 and 400", gu.Share, ga.Share)
	}
}

func TestLedgerFallingRegionKeepsLessHeadroom(t *testing.T) {
	c := client(t, redistest.Standalone(t).Addr)
	eu, us, ap := ledger(t, c, "eu", time.Minute), ledger(t, c, "us", time.Minute), ledger(t, c, "ap", time.Minute)
	renew(t, eu, "k", 400) // first sight: us and ap hold 300 each
	renew(t, us, "k", 0)   // 0 + min(500/3, 37) = 37
	renew(t, ap, "k", 0)   // 37
	// eu's demand falls from 400 to 200: its headroom is at most
	// 200/16 + m/8 = 30 (the slack's part is 700/3 = 233): 230.
	if g := renew(t, eu, "k", 200); g.Share != 230 {
		t.Fatalf("falling eu share = %d, want 200 + 30", g.Share)
	}
	// Steady at 200: the headroom is at most 200/4 + m/4 = 87: 287.
	if g := renew(t, eu, "k", 200); g.Share != 287 {
		t.Fatalf("steady eu share = %d, want 200 + 87", g.Share)
	}
}
