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

// The outage test's limit: outageLimit per outagePeriod, fail open, on
// three daemons, for each algorithm that fails open, cached (sliding_log
// is never cached) and strict; the pause of Redis straddles a window
// boundary so that the fixed window's new window is the one quota the
// pause may legitimately hand out.
const (
	outageLimit   = 30
	outagePeriod  = 5 * time.Second
	outagePause   = 3 * time.Second
	outageDaemons = 3
)

// outageRule is one rule of the outage test: an algorithm in a mode.
type outageRule struct{ alg, mode string }

// outageRules are the outage test's rules: every algorithm that can fail
// open, in each mode it can take.
var outageRules = func() []outageRule {
	var rs []outageRule
	for _, alg := range []string{"token_bucket", "gcra", "fixed_window", "sliding_counter", "sliding_log"} {
		for _, mode := range []string{"cached", "strict"} {
			if alg == "sliding_log" && mode == "cached" {
				continue
			}
			rs = append(rs, outageRule{alg, mode})
		}
	}
	return rs
}()

func (r outageRule) name() string { return r.alg + "-" + r.mode }

func outageConfig(addr string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nmax_connections = 1000\n\n[store]\nredis = [%q]\ntimeout = \"20ms\"\n", addr)
	for _, r := range outageRules {
		fmt.Fprintf(&b, "\n[[rule]]\nname = %q\nmatch = { alg = %q }\nby = [\"api_key\"]\nalgorithm = %q\nlimit = %d\nperiod = %q\nmode = %q\nfail = \"open\"\n",
			r.name(), r.name(), r.alg, outageLimit, outagePeriod.String(), r.mode)
	}
	return b.String()
}

// outageAnswer is what one check of the outage test got, and when.
type outageAnswer struct {
	sent, got time.Time
	status    wire.Status
	degraded  bool
	err       error
}

// TestFleetOutageStartsFromKnown: three daemons (processes) on one Redis,
// a key per rule (every algorithm that fails open, cached and strict)
// hammered at 10× its limit round-robin over their sockets; Redis is
// paused (SIGSTOP) for 3 s mid-run. What the fleet admits of each key
// while Redis is paused stays within the limit's quota of the pause ×
// (1 + 1/N): each daemon's fail-open state starts from what it last knew
// of the key (used up), from its lease's view for a cached rule and from
// the last strict decision for a strict one, not from a fresh share.
func TestFleetOutageStartsFromKnown(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	cfg := outageConfig(srv.Addr)
	var procs []*daemontest.Process
	var clients []*client.Client
	for range outageDaemons {
		p, err := daemontest.StartProcess(cfg)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		procs = append(procs, p)
		c := client.New(p.Socket)
		t.Cleanup(func() { c.Close() })
		clients = append(clients, c)
	}
	for i, p := range procs {
		redistest.WaitFor(t, fmt.Sprintf("daemon %d to count %d live daemons", i, outageDaemons), func() bool {
			return strings.Contains(p.Logs(), fmt.Sprintf("daemons=%d", outageDaemons))
		})
	}

	// The pause begins 1.5 s before a window boundary, at least 3 s into
	// the run, so that the keys are used up before it.
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

	// 10× the limit per key, spread over the three daemons in turn.
	interval := outagePeriod / (10 * outageLimit)
	var mu sync.Mutex
	answers := make([][]outageAnswer, len(outageRules))
	var wg sync.WaitGroup
	i := 0
	for next := time.Now(); next.Before(end); next = next.Add(interval) {
		time.Sleep(time.Until(next)) // pacing the load, not synchronising
		c := clients[i%len(clients)]
		i++
		for k, r := range outageRules {
			descs := []client.Descriptor{{Name: "api_key", Value: "hot"}, {Name: "alg", Value: r.name()}}
			wg.Go(func() {
				sent := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				res, err := c.Check(ctx, descs, 1)
				cancel()
				mu.Lock()
				answers[k] = append(answers[k], outageAnswer{sent, time.Now(), res.Status, res.Degraded, err})
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	resumed.Wait()

	pause := actualUp.Sub(actualDown)
	for k, r := range outageRules {
		t.Run(r.name(), func(t *testing.T) {
			var during, degraded, before, errs int
			for _, a := range answers[k] {
				if a.err != nil || a.status == wire.StatusError {
					errs++
					continue
				}
				allowed := a.status == wire.StatusAllowed || a.status == wire.StatusAllowedDegraded
				if a.degraded {
					degraded++ // allowed or limited on local state
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
			// The quota of the pause: the limit of each window that
			// starts in it for the fixed window; for the others, which
			// a key used up admits at the limit's rate, that rate over
			// the pause (rounded up).
			var quota int64
			switch r.alg {
			case "fixed_window":
				from, to := actualDown.UnixNano()/int64(outagePeriod), actualUp.UnixNano()/int64(outagePeriod)
				quota = outageLimit * (to - from)
			default:
				quota = (int64(pause)*outageLimit + int64(outagePeriod) - 1) / int64(outagePeriod)
			}
			bound := quota + quota/outageDaemons // × (1 + 1/N)
			t.Logf("%s: %d checks (%d before the pause allowed), %d admitted during the %v pause (%d degraded answers in all, allowed or limited), quota of the pause %d, bound %d (%.3f of it), errors %d",
				r.name(), len(answers[k]), before, during, pause.Round(time.Millisecond), degraded, quota, bound, float64(during)/float64(bound), errs)
			assert.Zero(t, errs, "error answers")
			assert.Positive(t, degraded, "the pause was decided locally")
			assert.Positive(t, quota, "the pause spans quota")
			assert.LessOrEqual(t, int64(during), bound, "admitted during the pause above the limit's quota × (1 + 1/N)")
		})
	}
}
