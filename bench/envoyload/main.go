// Command envoyload drives an Envoy rate limit service
// (envoy.service.ratelimit.v3) with a fixed number of calls in flight for
// a fixed time and prints one line: decisions/s, p50 and p99 latency, and,
// given the server's pid, its CPU time per decision (user+system, from
// /proc). bench/envoy.sh runs it against rld and envoyproxy/ratelimit.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rld/rld/envoyrls"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8081", "the service: host:port or unix:PATH")
	domain := flag.String("domain", "bench", "the domain")
	key := flag.String("key", "remote_address", "the descriptor's entry key")
	keys := flag.Uint64("keys", 0, "0: one hot value; N: values drawn from a Zipf distribution (s=1.1) over N")
	inflight := flag.Int("c", 64, "calls in flight")
	conns := flag.Int("conns", 4, "gRPC connections")
	dur := flag.Duration("d", 10*time.Second, "how long")
	pid := flag.Int("pid", 0, "the server's pid, for its CPU time per decision")
	label := flag.String("label", "", "the line's label")
	flag.Parse()
	if err := run(*addr, *domain, *key, *keys, *inflight, *conns, *dur, *pid, *label); err != nil {
		fmt.Fprintln(os.Stderr, "envoyload:", err)
		os.Exit(1)
	}
}

func run(addr, domain, key string, keys uint64, inflight, nconns int, dur time.Duration, pid int, label string) error {
	clients := make([]*envoyrls.Client, nconns)
	for i := range clients {
		c, err := envoyrls.Dial(addr)
		if err != nil {
			return err
		}
		defer c.Close()
		clients[i] = c
	}
	// Warm up: one call per connection.
	for _, c := range clients {
		if _, err := c.Check(context.Background(), domain, [][]envoyrls.Entry{{{Key: key, Value: "warm"}}}, 1); err != nil {
			return fmt.Errorf("warm-up call: %w", err)
		}
	}
	cpu0, err := cpuTime(pid)
	if err != nil {
		return err
	}
	// Calls carry no deadline (Envoy's own is its filter's timeout): the
	// run ends when each worker sees the end time after a call.
	ctx := context.Background()
	var stop atomic.Bool
	time.AfterFunc(dur, func() { stop.Store(true) })
	var mu sync.Mutex
	var lat []time.Duration
	var errs, over int
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	for w := range inflight {
		wg.Go(func() {
			c := clients[w%nconns]
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var z *rand.Zipf
			if keys > 0 {
				z = rand.NewZipf(rng, 1.1, 1, keys-1)
			}
			var mine []time.Duration
			var myErrs, myOver int
			var myFirst error
			for !stop.Load() {
				v := "hot"
				if z != nil {
					v = "k" + strconv.FormatUint(z.Uint64(), 10)
				}
				t0 := time.Now()
				r, err := c.Check(ctx, domain, [][]envoyrls.Entry{{{Key: key, Value: v}}}, 1)
				mine = append(mine, time.Since(t0))
				if err != nil {
					myErrs++
					if myFirst == nil {
						myFirst = err
					}
				} else if r.Code != "OK" {
					myOver++
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += myErrs
			over += myOver
			if firstErr == nil {
				firstErr = myFirst
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, err := cpuTime(pid)
	if err != nil {
		return err
	}
	slices.Sort(lat)
	n := len(lat)
	if n == 0 {
		return fmt.Errorf("no call completed")
	}
	pct := func(p float64) time.Duration { return lat[min(n-1, int(float64(n)*p))] }
	cpuPer := "n/a"
	if pid > 0 {
		cpuPer = fmt.Sprintf("%.1fµs", float64((cpu1-cpu0).Microseconds())/float64(n))
	}
	fmt.Printf("%-28s decisions/s=%-9.0f p50=%-9s p99=%-9s cpu/decision=%-8s calls=%d errors=%d over_limit=%d\n",
		label, float64(n)/elapsed.Seconds(), pct(0.50).Round(time.Microsecond), pct(0.99).Round(time.Microsecond), cpuPer, n, errs, over)
	if firstErr != nil {
		fmt.Printf("%-28s first error: %v\n", "", firstErr)
	}
	return nil
}

// cpuTime returns the user+system CPU time of process pid (0: none).
func cpuTime(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of pid %d: %w", pid, err)
	}
	// Fields after the command's closing parenthesis: utime and stime
	// are the 12th and 13th (fields 14 and 15 of stat(5)).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck, nil
}
