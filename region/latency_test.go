package region_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rld/rld/client"
)

// TestDecisionLatencyGlobalVersusLocal hammers, in the same run, the
// global rule ("g") and a local rule of the same limit ("loc", decided on
// each region's own Redis), each at ten times its limit from all six
// daemons, every client alternating the two: it checks that both are
// decided (a local rule admits at most its limit per region) and logs
// the round-trip latency of each rule's checks (p50, p99, max). Timing
// is logged, not asserted.
func TestDecisionLatencyGlobalVersusLocal(t *testing.T) {
	w := newWorld(t)
	d := phase(3 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var (
		mu     sync.Mutex
		lat    [2][]time.Duration // g, loc
		admits [2]int64
		errs   int
		wg     sync.WaitGroup
	)
	rate := int64(10 * limit / nRegions) // per region and rule
	for i := range nRegions {
		for j := range perRegion {
			wg.Add(1)
			go func(c *client.Client) {
				defer wg.Done()
				l, a, e := alternate(ctx, c, rate/perRegion)
				mu.Lock()
				defer mu.Unlock()
				for r := range l {
					lat[r] = append(lat[r], l[r]...)
					admits[r] += a[r]
				}
				errs += e
			}(w.clients[i][j])
		}
	}
	wg.Wait()
	if errs > 0 {
		t.Fatalf("%d check errors", errs)
	}
	for r, name := range []string{"global", "local"} {
		if len(lat[r]) == 0 {
			t.Fatalf("no %s check decided", name)
		}
		slices.Sort(lat[r])
		q := func(p float64) time.Duration { return lat[r][int(p*float64(len(lat[r])-1))] }
		t.Logf("%s rule: %d checks, %d admitted; round trip p50 %s, p99 %s, max %s", name, len(lat[r]), admits[r],
			q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond), q(1).Round(time.Microsecond))
	}
	// The local rule holds its limit in each region: at most a full bucket
	// and its refill there, plus the interval-long ends of the run.
	if most := int64(nRegions) * bound(d+time.Second); admits[1] > most {
		t.Fatalf("local rule admitted %d, more than %d regions' bound %d", admits[1], nRegions, most)
	}
}

// alternate checks the global key and the local key in turn on c, each
// at rate per second, until ctx is done, and returns each rule's round
// trips, admissions and the errors.
func alternate(ctx context.Context, c *client.Client, rate int64) (lat [2][]time.Duration, admits [2]int64, errs int) {
	descs := [2][]client.Descriptor{{{Name: "api_key", Value: "k"}}, {{Name: "user", Value: "k"}}}
	next := time.Now()
	for n := 0; ctx.Err() == nil; n++ {
		r := n % 2
		if r == 0 {
			next = next.Add(time.Second / time.Duration(rate))
			if d := time.Until(next); d > 0 {
				time.Sleep(d) // pacing the load, not a synchronization
			} else if d < -100*time.Millisecond {
				next = time.Now()
			}
		}
		start := time.Now()
		res, err := c.Check(ctx, descs[r], 1)
		took := time.Since(start)
		switch {
		case ctx.Err() != nil:
		case err != nil:
			errs++
		default:
			lat[r] = append(lat[r], took)
			if res.Allowed() {
				admits[r]++
			}
		}
	}
	return lat, admits, errs
}
