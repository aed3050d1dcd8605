//go:build soak

package daemon_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
)

// TestSoak is `make soak`: minutes of mixed load through three daemons
// while Redis is killed, paused and restarted at random. At the end: no
// error answers, no goroutine left behind, bounded memory, and every key
// within its exact bound plus what each outage's fail-open allows. It
// runs for $RLD_SOAK (default 3m) and ends with one summary line.
func TestSoak(t *testing.T) {
	duration := 3 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("RLD_SOAK")); err == nil {
		duration = d
	}
	goroutinesBefore := runtime.NumGoroutine()
	srv := redistest.Standalone(t)

	const limit, period = 50, time.Second
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "[server]\nmax_connections = 1000\n\n[store]\nredis = [%q]\ntimeout = \"50ms\"\n", srv.Addr)
	kinds := []algo.Kind{algo.TokenBucket, algo.GCRA, algo.FixedWindow, algo.SlidingCounter, algo.SlidingLog}
	for _, k := range kinds {
		fmt.Fprintf(&cfg, "\n[[rule]]\nname = %q\nmatch = { alg = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = %d\nperiod = %q\n",
			k, k, k, limit, period)
	}
	var fleet []*daemontest.Server
	for range 3 {
		s, err := daemontest.Start(cfg.String())
		if err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, s)
	}

	type key struct {
		kind                     algo.Kind
		name                     string
		rate                     float64 // offered checks per second, in all
		admitted, degraded, errs atomic.Int64
		checks                   atomic.Int64
		first, last              atomic.Int64
	}
	var keys []*key
	for _, k := range kinds {
		// One key far over its limit, one at about half of it.
		keys = append(keys, &key{kind: k, name: "hot-" + k.String(), rate: 5 * limit / period.Seconds()})
		keys = append(keys, &key{kind: k, name: "calm-" + k.String(), rate: 0.5 * limit / period.Seconds()})
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var clients []*client.Client
	for _, k := range keys {
		for _, s := range fleet {
			c := client.New(s.Socket)
			clients = append(clients, c)
			wg.Go(func() {
				interval := time.Duration(float64(time.Second) * float64(len(fleet)) / k.rate)
				descs := []client.Descriptor{{Name: "api_key", Value: k.name}, {Name: "alg", Value: k.kind.String()}}
				for next := time.Now(); ; next = next.Add(interval) {
					select {
					case <-stop:
						return
					case <-time.After(time.Until(next)):
					}
					storeMin(&k.first, time.Now().UnixMicro())
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					r, err := c.Check(ctx, descs, 1)
					cancel()
					storeMax(&k.last, time.Now().UnixMicro())
					k.checks.Add(1)
					switch {
					case err != nil || (!r.Allowed() && r.RetryAfter <= 0):
						k.errs.Add(1)
					case r.Allowed():
						k.admitted.Add(1)
					}
					if err == nil && r.Degraded {
						k.degraded.Add(1)
					}
				}
			})
		}
	}

	// Chaos: every 3 to 8 s, kill Redis (and start it again 0.5 to 2 s
	// later: an empty Redis, as with no persistence) or pause it for 0.3
	// to 1.5 s.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var kills, pauses int
	var outage time.Duration
	deadline := time.Now().Add(duration)
	for time.Now().Add(10 * time.Second).Before(deadline) {
		time.Sleep(time.Duration(3000+rng.IntN(5000)) * time.Millisecond) // the chaos's schedule
		began := time.Now()
		if rng.IntN(2) == 0 {
			kills++
			srv.Kill()
			time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Millisecond)
			srv.Start(t)
		} else {
			pauses++
			srv.Pause()
			time.Sleep(time.Duration(300+rng.IntN(1200)) * time.Millisecond)
			srv.Resume()
		}
		outage += time.Since(began)
	}
	time.Sleep(time.Until(deadline))
	close(stop)
	wg.Wait()
	for _, c := range clients {
		c.Close()
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	for _, s := range fleet {
		s.Close()
	}

	// Bounds: the exact bound over the run, plus for every outage a full
	// capacity that fail-open may admit, the refill over the outage and
	// the second after it, and a capacity that a killed Redis forgets.
	outages := int64(kills + pauses)
	var checks, admitted, errs, degraded int64
	within := 0
	for _, k := range keys {
		p := algo.Params{Kind: k.kind, Limit: limit, Period: period}
		span := k.last.Load() - k.first.Load()
		exact := p.Limit * (span/p.PeriodMicros() + 2)
		allowance := outages*2*p.Capacity() + (outage.Microseconds()+outages*1_000_000)*p.Limit/p.PeriodMicros()
		if k.admitted.Load() <= exact+allowance {
			within++
		} else {
			t.Errorf("key %s: admitted %d, bound %d + outages %d", k.name, k.admitted.Load(), exact, allowance)
		}
		checks += k.checks.Load()
		admitted += k.admitted.Load()
		errs += k.errs.Load()
		degraded += k.degraded.Load()
	}
	// Goroutines: back to where they were once the daemons are closed.
	var goroutinesAfter int
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		goroutinesAfter = runtime.NumGoroutine()
		if goroutinesAfter <= goroutinesBefore+5 || time.Now().After(end) {
			break
		}
	}
	assert.Zero(t, errs, "error answers")
	assert.LessOrEqual(t, goroutinesAfter, goroutinesBefore+5, "goroutines left behind")
	assert.Less(t, ms.HeapAlloc, uint64(256<<20), "heap")
	fmt.Printf("soak: %v, %d kills and %d pauses (%v of outage), %d checks, %d admitted, %d degraded, %d errors, goroutines %d→%d, heap %d MB, %d/%d keys within bounds\n",
		duration, kills, pauses, outage.Round(time.Millisecond), checks, admitted, degraded, errs,
		goroutinesBefore, goroutinesAfter, ms.HeapAlloc>>20, within, len(keys))
}
