package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// The outage test's limit: outageLimit per outagePeriod, cached, fail
// open, on three daemons; the pause of Redis straddles a window boundary
// so that the fixed window's new window is the one quota the pause may
// legitimately hand out.
const (
	outageLimit   = 60
	outagePeriod  = 10 * time.Second
	outagePause   = 3 * time.Second
	outageDaemons = 3
)

func outageConfig(addr string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nmax_connections = 1000\n\n[store]\nredis = [%q]\ntimeout = \"20ms\"\n", addr)
	for _, alg := range []string{"token_bucket", "fixed_window"} {
		fmt.Fprintf(&b, "\n[[rule]]\nname = %q\nmatch = { alg = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = %d\nperiod = %q\nmode = \"cached\"\nfail = \"open\"\n",
			alg, alg, alg, outageLimit, outagePeriod.String())
	}
	return b.String()
}

// TestFleetOutageStartsFromKnown: three daemons (processes) on one Redis,
// one key hammered at 10× its limit round-robin over their sockets; Redis
// is paused (SIGSTOP) for 3 s mid-run. What the fleet admits while Redis
// is paused stays within the limit's quota of the pause × (1 + 1/N): each
// daemon's fail-open state starts from what it last knew of the key (used
// up), not from a fresh share.
func TestFleetOutageStartsFromKnown(t *testing.T) {
	srv := redistest.Standalone(t)
	cfg := outageConfig(srv.Addr)
	var sockets []string
	var procs []*daemontest.Process
	for range outageDaemons {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		procs = append(procs, p)
		sockets = append(sockets, p.Socket)
	}
	for i, p := range procs {
		redistest.WaitFor(t, fmt.Sprintf("daemon %d to count %d live daemons", i, outageDaemons), func() bool {
			return strings.Contains(p.Logs(), fmt.Sprintf("daemons=%d", outageDaemons))
		})
	}
	for _, alg := range []string{"token_bucket", "fixed_window"} {
		t.Run(alg, func(t *testing.T) {
			var clients []*client.Client
			for _, s := range sockets {
				c := client.New(s)
				t.Cleanup(func() { c.Close() })
				clients = append(clients, c)
			}
			descs := []client.Descriptor{{Name: "api_key", Value: "hot-" + alg}, {Name: "alg", Value: alg}}

			// The pause begins 1.5 s before a window boundary, at least
			// 3 s into the run, so that the key is used up before it.
			start := time.Now()
			down := start.Add(3 * time.Second).Truncate(outagePeriod).Add(outagePeriod - 1500*time.Millisecond)
			if down.Sub(start) < 3*time.Second {
				down = down.Add(outagePeriod)
			}
			up := down.Add(outagePause)
			end := up.Add(2 * time.Second)
			var resumed sync.WaitGroup
			resumed.Add(1)
			var actualDown, actualUp time.Time
			time.AfterFunc(time.Until(down), func() {
				actualDown = time.Now()
				srv.Pause()
				time.AfterFunc(outagePause, func() {
					srv.Resume()
					actualUp = time.Now()
					resumed.Done()
				})
			})

			// 10× the limit, spread over the three daemons in turn.
			interval := outagePeriod / (10 * outageLimit)
			type ans struct {
				sent, got time.Time
				status    wire.Status
				err       error
			}
			var mu sync.Mutex
			var answers []ans
			var wg sync.WaitGroup
			i := 0
			for next := time.Now(); next.Before(end); next = next.Add(interval) {
				time.Sleep(time.Until(next)) // pacing the load, not synchronising
				c := clients[i%len(clients)]
				i++
				wg.Go(func() {
					sent := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					r, err := c.Check(ctx, descs, 1)
					cancel()
					mu.Lock()
					answers = append(answers, ans{sent, time.Now(), r.Status, err})
					mu.Unlock()
				})
			}
			wg.Wait()
			resumed.Wait()

			var during, degraded, before, errs int
			for _, a := range answers {
				if a.err != nil || a.status == wire.StatusError {
					errs++
					continue
				}
				allowed := a.status == wire.StatusAllowed || a.status == wire.StatusAllowedDegraded
				if a.status == wire.StatusAllowedDegraded {
					degraded++
				}
				// Decided while Redis was paused: sent after it
				// stopped, answered before it resumed.
				if allowed && !a.sent.Before(actualDown) && !a.got.After(actualUp) {
					during++
				}
				if allowed && a.got.Before(actualDown) {
					before++
				}
			}
			pause := actualUp.Sub(actualDown)
			// The quota of the pause: the refill over it for the token
			// bucket (rounded up), the limit of each window that starts
			// in it for the fixed window.
			var quota int64
			switch alg {
			case "token_bucket":
				quota = (int64(pause)*outageLimit + int64(outagePeriod) - 1) / int64(outagePeriod)
			case "fixed_window":
				from, to := actualDown.UnixNano()/int64(outagePeriod), actualUp.UnixNano()/int64(outagePeriod)
				quota = outageLimit * (to - from)
			}
			bound := quota + quota/outageDaemons // × (1 + 1/N)
			t.Logf("%s: %d checks (%d before the pause allowed), %d admitted during the %v pause (%d degraded answers in all), quota of the pause %d, bound %d, errors %d",
				alg, len(answers), before, during, pause.Round(time.Millisecond), degraded, quota, bound, errs)
			assert.Zero(t, errs, "error answers")
			assert.Positive(t, degraded, "the pause was decided locally")
			assert.Positive(t, quota, "the pause spans quota")
			assert.LessOrEqual(t, int64(during), bound, "admitted during the pause above the limit's quota × (1 + 1/N)")
		})
	}
}
