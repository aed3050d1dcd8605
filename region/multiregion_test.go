package region_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/region"
)

// The world of the multi-region tests: three regions (a Redis and two
// daemons each) and a global Redis, reached from each region through a
// proxy that adds globalDelay each way.
const (
	nRegions    = 3
	perRegion   = 2
	limit       = 300 // per second, the global rule's
	fallback    = limit / nRegions
	interval    = 200 * time.Millisecond
	lease       = 4 * interval
	globalDelay = 40 * time.Millisecond
)

// soak reports whether the long versions run (RLD_REGIONS_SOAK=1, as
// make soak sets it: 60 s phases).
func soak() bool { return os.Getenv("RLD_REGIONS_SOAK") != "" }

// phase is how long each phase of a test runs: short for make test.
func phase(short time.Duration) time.Duration {
	if soak() {
		return 60 * time.Second
	}
	return short
}

type world struct {
	global   *redistest.Server
	proxies  [nRegions]*redistest.Proxy
	regional [nRegions]*redistest.Server
	rc       [nRegions]rueidis.Client
	daemons  [nRegions][perRegion]*daemontest.Server
	clients  [nRegions][perRegion]*client.Client
	gc       rueidis.Client
	extra    string // more keys of the global rule "g"
}

func regionName(i int) string { return "r" + strconv.Itoa(i) }

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldOf(t, "")
}

// newWorldOf is newWorld with extra added to the global rule's keys.
func newWorldOf(t *testing.T, extra string) *world {
	t.Helper()
	w := &world{global: redistest.Standalone(t), extra: extra}
	w.gc = dial(t, w.global.Addr)
	for i := range nRegions {
		w.regional[i] = redistest.Standalone(t)
		w.rc[i] = dial(t, w.regional[i].Addr)
		w.proxies[i] = redistest.StartProxy(t, w.global.Addr)
		w.proxies[i].Delay(globalDelay)
		for j := range perRegion {
			s, err := daemontest.Start(w.config(i))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			w.daemons[i][j] = s
			c, err := client.Dial(context.Background(), s.Socket)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			w.clients[i][j] = c
		}
	}
	return w
}

func (w *world) config(i int) string {
	return fmt.Sprintf(`[server]
max_connections = 100

[store]
redis = [%q]
timeout = "500ms"

[global]
redis = [%q]
region = %q
regions = ["r0", "r1", "r2"]
interval = %q
lease = %q

[[rule]]
name = "g"
by = ["api_key"]
algorithm = "token_bucket"
limit = %d
period = "1s"
scope = "global"
%s

[[rule]]
name = "loc"
by = ["user"]
algorithm = "token_bucket"
limit = %d
period = "1s"
`, w.regional[i].Addr, w.proxies[i].Addr(), regionName(i), interval, lease, limit, w.extra, limit)
}

func dial(t testing.TB, addr string) rueidis.Client {
	t.Helper()
	c, err := region.Dial(region.DialOptions{Addrs: []string{addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// share returns region i's share of the hammered key and its expiry, as
// its renewer last wrote them (0 and the zero time when none).
func (w *world) share(t testing.TB, i int) (int64, time.Time) {
	t.Helper()
	m, err := w.rc[i].Do(context.Background(), w.rc[i].B().Hgetall().Key(region.SharesKey).Build()).AsStrMap()
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range m {
		parts := strings.Split(v, ":") // units:expiry_ms:demand:stamp
		if len(parts) != 4 {
			t.Fatalf("share %q: want units:expiry_ms:demand:stamp", v)
		}
		units, err1 := strconv.ParseInt(parts[0], 10, 64)
		ms, err2 := strconv.ParseInt(parts[1], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("share %q: %v %v", v, err1, err2)
		}
		return units, time.UnixMilli(ms)
	}
	return 0, time.Time{}
}

// counts are one region's answers.
type counts struct {
	allowed, denied, errs atomic.Int64
	mu                    sync.Mutex
	deniedAt              []time.Time // when each refusal came
}

// refusals returns how many refusals came in each step of width step
// from origin on, until to.
func (c *counts) refusals(origin, to time.Time, step time.Duration) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]int, int(to.Sub(origin)/step)+1)
	for _, at := range c.deniedAt {
		if i := int(at.Sub(origin) / step); !at.Before(origin) && i < len(out) {
			out[i]++
		}
	}
	return out
}

// load drives checks of key "k" at each region's rate (checks per
// second, split over its daemons) until stop is called.
type load struct {
	rate   [nRegions]atomic.Int64
	counts [nRegions]counts
	stop   context.CancelFunc
	wg     sync.WaitGroup
}

func (w *world) drive(rates [nRegions]int64) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{stop: cancel}
	for i := range nRegions {
		l.rate[i].Store(rates[i])
		for j := range perRegion {
			l.wg.Add(1)
			go l.run(ctx, w.clients[i][j], i)
		}
	}
	return l
}

// run paces one daemon's checks at its share of its region's rate.
func (l *load) run(ctx context.Context, c *client.Client, i int) {
	defer l.wg.Done()
	desc := []client.Descriptor{{Name: "api_key", Value: "k"}}
	next := time.Now()
	for ctx.Err() == nil {
		rate := l.rate[i].Load()
		if rate <= 0 {
			time.Sleep(10 * time.Millisecond)
			next = time.Now()
			continue
		}
		next = next.Add(time.Duration(int64(time.Second) * perRegion / rate))
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		} else if d < -100*time.Millisecond {
			next = time.Now() // too far behind: do not burst to catch up
		}
		res, err := c.Check(ctx, desc, 1)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			l.counts[i].errs.Add(1)
		case res.Allowed():
			l.counts[i].allowed.Add(1)
		default:
			l.counts[i].denied.Add(1)
			l.counts[i].mu.Lock()
			l.counts[i].deniedAt = append(l.counts[i].deniedAt, time.Now())
			l.counts[i].mu.Unlock()
		}
	}
}

func (l *load) halt() {
	l.stop()
	l.wg.Wait()
}

func (l *load) allowed() (n int64) {
	for i := range nRegions {
		n += l.counts[i].allowed.Load()
	}
	return n
}

func (l *load) decided() (n int64) {
	for i := range nRegions {
		n += l.counts[i].allowed.Load() + l.counts[i].denied.Load()
	}
	return n
}

// renewals returns the renew scripts the global store ran.
func (w *world) renewals(t testing.TB) int64 {
	t.Helper()
	info, err := w.gc.Do(context.Background(), w.gc.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(line, cmd); ok {
				v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				n += v
			}
		}
	}
	return n
}

// bound is the most a token bucket of limit/s and burst limit admits in
// d: a full bucket, then the refill.
func bound(d time.Duration) int64 { return limit + int64(d.Seconds()*limit) }

// TestHammerAdmitsAtMostTheGlobalBound hammers the global key at ten
// times its limit from all six daemons and counts what was admitted.
func TestHammerAdmitsAtMostTheGlobalBound(t *testing.T) {
	w := newWorld(t)
	d := phase(3 * time.Second)
	start := time.Now()
	l := w.drive([nRegions]int64{10 * limit / 3, 10 * limit / 3, 10 * limit / 3})
	time.Sleep(d) // the load's duration, not a synchronization
	l.halt()
	took := time.Since(start)
	admitted, decided := l.allowed(), l.decided()
	b := bound(took)
	// Rounding: shares are whole units, a region's scaled burst rounds
	// down; the residual race (a daemon applies a lowered share within
	// one interval) adds at most one interval's refill.
	slack := int64(limit * interval.Seconds())
	t.Logf("admitted %d of %d decided in %s; bound %d (+%d); global renewals %d = %.4f per decision",
		admitted, decided, took.Round(time.Millisecond), b, slack, w.renewals(t), float64(w.renewals(t))/float64(decided))
	l.within(t, admitted, b, slack)
}

// snapshot returns the allowed and denied counts of every region.
func (l *load) snapshot() (allowed, denied int64) {
	for i := range nRegions {
		allowed += l.counts[i].allowed.Load()
		denied += l.counts[i].denied.Load()
	}
	return allowed, denied
}

// TestDemandShiftMovesTheShare moves a client under the global limit
// (80% of it) from 90/5/5 to 5/5/90 across the regions within a second
// (ten even steps): the new region holds most of the limit within three
// intervals of the shift's end, and less than 1% of the checks from the
// shift's start on are refused; the refusals are reported by region and
// interval (and, with
// RLD_REGIONS_TRACE=1, the stores' commands: each flush, renewal and
// load, timed).
func TestDemandShiftMovesTheShare(t *testing.T) {
	w := newWorld(t)
	var mons []*monitor
	if tracing() {
		mons = append(mons, startMonitor(t, "r0", w.regional[0].Addr), startMonitor(t, "r2", w.regional[2].Addr),
			startMonitor(t, "gl", w.global.Addr))
	}
	total := int64(limit * 8 / 10)
	big, small := total*90/100, total*5/100
	l := w.drive([nRegions]int64{big, small, small})
	defer l.halt()
	// Settle: r0 holds most of the limit.
	redistest.WaitFor(t, "r0 holds most of the limit", func() bool {
		s, _ := w.share(t, 0)
		return s > limit/2
	})
	time.Sleep(phase(time.Second)) // steady load before the shift, not a synchronization
	a0, d0 := l.snapshot()
	var byRegion0 [nRegions]int64
	for i := range nRegions {
		byRegion0[i] = l.counts[i].denied.Load()
	}
	rampStart := time.Now()
	var crossed time.Time // when r2 first held most of the limit
	for step := int64(1); step <= 10; step++ {
		l.rate[0].Store(big + (small-big)*step/10)
		l.rate[2].Store(small + (big-small)*step/10)
		time.Sleep(100 * time.Millisecond) // the ramp's pace, not a synchronization
		if s, _ := w.share(t, 2); s > limit/2 && crossed.IsZero() {
			crossed = time.Now()
		}
	}
	shifted := time.Now()
	redistest.WaitFor(t, "r2 holds most of the limit", func() bool {
		s, _ := w.share(t, 2)
		return s > limit/2
	})
	if crossed.IsZero() {
		crossed = time.Now()
	}
	took := max(crossed.Sub(shifted), 0)
	fromStart := crossed.Sub(rampStart)
	time.Sleep(phase(2 * time.Second)) // the load after the shift
	a1, d1 := l.snapshot()
	allowed, denied := a1-a0, d1-d0
	for _, m := range mons {
		m.log(t, rampStart, rampStart.Add(-interval), time.Now())
	}
	var byRegion [nRegions]int64
	for i := range nRegions {
		byRegion[i] = l.counts[i].denied.Load() - byRegion0[i]
	}
	t.Logf("refused by region from the shift's start: %v", byRegion)
	for i := range nRegions {
		per := l.counts[i].refusals(rampStart, time.Now(), interval)
		head, rest := per[:min(len(per), 16)], 0
		for _, n := range per[len(head):] {
			rest += n
		}
		t.Logf("r%d's refusals per interval from the shift's start: %v, then %d", i, head, rest)
	}
	t.Logf("r2 held most of the limit %s (%.1f intervals) after the shift's end (%s after its start); refused %d of %d from its start (%.2f%%)",
		took.Round(time.Millisecond), took.Seconds()/interval.Seconds(), fromStart.Round(time.Millisecond), denied, allowed+denied, 100*float64(denied)/float64(allowed+denied))
	// Three intervals from the shift's end (issue 33): the daemons flush
	// just before the renewer takes the demand, and load the new share on
	// the renewer's message.
	if took > 3*interval {
		t.Fatalf("r2 took %s to hold most of the limit, want within 3 intervals (%s)", took, 3*interval)
	}
	// The aim is less than 1% refused: 43 of 44 runs on an idle two-core
	// host met it, one refused 1.39% (docs/regions.md). The test fails
	// at 3%, where a region's rising demand is no longer met by early
	// renewals and the even slack split.
	if 100*denied >= 3*(allowed+denied) {
		t.Fatalf("refused %d of %d checks from the shift's start, want less than 3%%", denied, allowed+denied)
	}
}

// skewed is a hammer at ten times the limit in all, most of it on r0:
// r0's share is then well above its fallback share.
var skewed = [nRegions]int64{8 * limit, limit, limit}

// TestPartitionedRegionFallsBackOthersReclaim cuts r0 off the global
// store: r1 and r2 keep their shares and receive r0's once its lease has
// expired; r0 then admits at most its fallback share; the totals stay
// within the bound docs/regions.md states (the global bound plus r0's
// fallback share per period). Healed, r0 renews again.
func TestPartitionedRegionFallsBackOthersReclaim(t *testing.T) {
	w := newWorld(t)
	l := w.drive(skewed)
	defer l.halt()
	redistest.WaitFor(t, "r0 holds most of the limit", func() bool {
		s, _ := w.share(t, 0)
		return s > limit/2
	})
	before, _ := w.share(t, 1)
	w.proxies[0].Blackhole()
	cut := time.Now()
	a0 := l.allowed()
	redistest.WaitFor(t, "r1 and r2 hold r0's share", func() bool {
		s1, _ := w.share(t, 1)
		s2, _ := w.share(t, 2)
		return s1+s2 >= limit-2
	})
	reclaimed := time.Since(cut)
	// r0's own share lapsed by now (its lease is no longer than the
	// global store's): it decides with its fallback share.
	r0From := l.counts[0].allowed.Load()
	d := phase(3 * time.Second)
	time.Sleep(d) // the partition's length, not a synchronization
	r0 := l.counts[0].allowed.Load() - r0From
	all := l.allowed() - a0
	span := time.Since(cut)
	w.proxies[0].Heal()
	r0Bound := fallback + int64(d.Seconds()*fallback) + int64(fallback*interval.Seconds())
	total := bound(span) + int64(span.Seconds()*fallback) + int64(limit*interval.Seconds())
	t.Logf("r1+r2 held r0's share %s after the cut (r1 had %d; lease %s); r0 admitted %d in %s (bound %d); all admitted %d in %s (bound %d)",
		reclaimed.Round(time.Millisecond), before, lease, r0, d, r0Bound, all, span.Round(time.Millisecond), total)
	// About T + 2I (r0's lease expires, then the others' renewals take
	// its share up); the bound is generous for a loaded host, whose
	// renewals run late (1.79 s seen with two test streams on 2 cores).
	if reclaimed > 2*lease+3*interval {
		t.Fatalf("r0's share reached the others %s after the cut, want within twice the lease %s + 3 intervals", reclaimed, lease)
	}
	if r0 > r0Bound {
		t.Fatalf("cut-off r0 admitted %d in %s, more than its fallback share allows (%d)", r0, d, r0Bound)
	}
	if all > total {
		t.Fatalf("admitted %d during the partition, more than the stated bound %d", all, total)
	}
	healed := time.Now()
	redistest.WaitFor(t, "r0 renews after the heal", func() bool {
		_, exp := w.share(t, 0)
		return exp.After(healed.Add(lease / 2))
	})
}

// TestGlobalStoreRestartedEmpty kills the global store and starts it
// again with nothing: the ledgers are rebuilt at fallback shares, every
// region renews again, and the overage stays within one lease's worth of
// the limit.
func TestGlobalStoreRestartedEmpty(t *testing.T) {
	w := newWorld(t)
	l := w.drive(skewed)
	defer l.halt()
	redistest.WaitFor(t, "r0 holds most of the limit", func() bool {
		s, _ := w.share(t, 0)
		return s > limit/2
	})
	a0 := l.allowed()
	start := time.Now()
	w.global.Kill()
	w.global.Start(t)
	restarted := time.Now()
	for i := range nRegions {
		redistest.WaitFor(t, "region "+regionName(i)+" renews on the new global store", func() bool {
			_, exp := w.share(t, i)
			return exp.After(restarted.Add(lease)) // sent after the restart
		})
	}
	rebuilt := time.Since(restarted)
	// The test's own client lost its connection with the restart: the
	// first call may fail.
	redistest.WaitFor(t, "the key's ledger on the restarted global store", func() bool {
		keys, err := w.gc.Do(context.Background(), w.gc.B().Keys().Pattern(region.LedgerPrefix+"*").Build()).AsStrSlice()
		return err == nil && len(keys) == 1
	})
	time.Sleep(phase(2 * time.Second)) // the load after the restart, not a synchronization
	all := l.allowed() - a0
	span := time.Since(start)
	over := int64(limit * lease.Seconds())
	b := bound(span) + over + int64(limit*interval.Seconds())
	t.Logf("every region renewed %s after the restart; admitted %d in %s (bound %d = refill %d + one lease's worth %d + one interval's)",
		rebuilt.Round(time.Millisecond), all, span.Round(time.Millisecond), b, bound(span), over)
	if all > b {
		t.Fatalf("admitted %d across the restart, more than %d", all, b)
	}
}

// TestGlobalNeedsRegionalRedis: a daemon with [global] and the embedded
// store does not start, with a clear error.
func TestGlobalNeedsRegionalRedis(t *testing.T) {
	_, err := daemontest.Start(`[global]
redis = ["127.0.0.1:1"]
region = "r0"
regions = ["r0", "r1"]
`)
	if err == nil || !strings.Contains(err.Error(), "[global] needs store.redis") {
		t.Fatalf("start with [global] and no store.redis: %v", err)
	}
}

// TestStrictGlobalKeyFirstCheckThenHammer: with global_strict, the first
// check of a key in each region is admitted on a share renewed at once
// on the global store (one round trip through the proxy; the share is in
// the region's shares hash right after it), and the regions hammering the
// key at ten times its limit admit at most the global bound.
func TestStrictGlobalKeyFirstCheckThenHammer(t *testing.T) {
	w := newWorldOf(t, "global_strict = true")
	desc := []client.Descriptor{{Name: "api_key", Value: "k"}}
	start := time.Now()
	for i := range nRegions {
		at := time.Now()
		res, err := w.clients[i][0].Check(context.Background(), desc, 1)
		took := time.Since(at)
		if err != nil || !res.Allowed() {
			t.Fatalf("region %d: first check of a strict key: %+v %v, want admitted", i, res, err)
		}
		units, exp := w.share(t, i)
		if units <= 0 || !exp.After(time.Now()) {
			t.Fatalf("region %d: share %d until %s after the first check: want a live share renewed by it", i, units, exp)
		}
		if took < 2*globalDelay {
			t.Fatalf("region %d: first check answered in %s, less than a global round trip", i, took)
		}
	}
	l := w.drive([nRegions]int64{10 * limit / 3, 10 * limit / 3, 10 * limit / 3})
	time.Sleep(phase(3 * time.Second)) // the load's duration, not a synchronization
	l.halt()
	took := time.Since(start)
	admitted := l.allowed() + nRegions
	b, slack := bound(took), int64(limit*interval.Seconds())
	t.Logf("admitted %d of %d decided in %s; bound %d (+%d); global renewals %d", admitted, l.decided()+nRegions, took.Round(time.Millisecond), b, slack, w.renewals(t))
	l.within(t, admitted, b, slack)
}

// TestStrictGlobalKeyPartitionedAnswersByFailMode: a region cut off from
// the global store (its proxy drops the traffic) answers the first check
// of a strict key by the rule's fail mode (closed: refused, degraded)
// within the bound (two intervals from the renewal's start), not hung;
// a region still reaching the global store admits it.
func TestStrictGlobalKeyPartitionedAnswersByFailMode(t *testing.T) {
	w := newWorldOf(t, "global_strict = true\nfail = \"closed\"")
	w.proxies[0].Blackhole()
	desc := []client.Descriptor{{Name: "api_key", Value: "z"}}
	for j := range perRegion {
		at := time.Now()
		res, err := w.clients[0][j].Check(context.Background(), desc, 1)
		took := time.Since(at)
		if err != nil || res.Allowed() || !res.Degraded {
			t.Fatalf("daemon %d of the cut-off region: %+v %v, want refused and degraded (fail closed)", j, res, err)
		}
		t.Logf("daemon %d of the cut-off region: refused in %s", j, took.Round(time.Millisecond))
		if took < 2*interval || took > 10*interval {
			t.Fatalf("daemon %d of the cut-off region answered in %s, want the bound %s (at most 10 intervals: not hung)", j, took, 2*interval)
		}
	}
	res, err := w.clients[1][0].Check(context.Background(), desc, 1)
	if err != nil || !res.Allowed() {
		t.Fatalf("a region reaching the global store: %+v %v, want admitted", res, err)
	}
}

// within fails t when admitted exceeds the bound b + slack, falls short
// of half of b (the shares starve the regions), or a check failed.
func (l *load) within(t *testing.T, admitted, b, slack int64) {
	t.Helper()
	if admitted > b+slack {
		t.Fatalf("admitted %d > bound %d + %d", admitted, b, slack)
	}
	if admitted < b/2 {
		t.Fatalf("admitted %d, less than half the bound %d: the shares starve the regions", admitted, b)
	}
	for i := range nRegions {
		if n := l.counts[i].errs.Load(); n > 0 {
			t.Fatalf("region %d: %d check errors", i, n)
		}
	}
}
