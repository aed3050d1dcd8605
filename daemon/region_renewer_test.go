package daemon_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/rld/rld/client"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/region"
)

// TestRegionRenewerKilled: two daemon processes of one region, a global
// store; the one elected to renew the region's shares is killed
// (SIGKILL, no hand-over): the other takes the role over within the
// time docs/regions.md states (the renewer key lapses after 3 × interval,
// and every daemon tries once an interval: 4 × interval), and renews
// the busy key's share on the global store from then on.
func TestRegionRenewerKilled(t *testing.T) {
	t.Parallel()
	const interval = 200 * time.Millisecond
	global, regional := redistest.Standalone(t), redistest.Standalone(t)
	cfg := fmt.Sprintf(`
[store]
redis = [%q]

[global]
redis = [%q]
region = "r0"
regions = ["r0", "r1"]
interval = %q
lease = "800ms"

[[rule]]
name = "global"
by = ["api_key"]
limit = 1000
period = "1s"
scope = "global"
`, regional.Addr, global.Addr, interval)
	ps, https := startMetricsFleet(t, cfg, 2)
	renewer := func() int {
		for i, h := range https {
			if scrapeMetric(t, h, "rld_region_renewer") == 1 {
				return i
			}
		}
		return -1
	}
	redistest.WaitFor(t, "one daemon renews the region's shares", func() bool { return renewer() >= 0 })
	killed := renewer()
	other := 1 - killed

	// Demand on a key, through the daemon that stays, so that the
	// renewer has a key to renew.
	c := client.New(ps[other].Socket)
	t.Cleanup(func() { c.Close() })
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = c.Check(ctx, []client.Descriptor{{Name: "api_key", Value: "k"}}, 1)
			cancel()
			time.Sleep(5 * time.Millisecond) // pacing the load, not synchronising
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	redistest.WaitFor(t, "the busy key's share in the region's shares", func() bool {
		v, err := redistest.Do(regional.Addr, "HLEN", region.SharesKey)
		return err == nil && strings.TrimSpace(v) != "0"
	})
	renewals := scrapeMetric(t, https[other], "rld_region_renewals_total")
	assert.Zero(t, renewals, "the daemon that is not the renewer renews nothing")

	ps[killed].Kill()
	at := time.Now()
	redistest.WaitFor(t, "the other daemon takes the renewer's role", func() bool {
		return scrapeMetric(t, https[other], "rld_region_renewer") == 1
	})
	took := time.Since(at)
	redistest.WaitFor(t, "the new renewer renews the busy key", func() bool {
		return scrapeMetric(t, https[other], "rld_region_renewals_total") > 0
	})
	t.Logf("renewer killed: the other daemon took over %v after the kill (%.1f intervals), and renews", took.Round(time.Millisecond), took.Seconds()/interval.Seconds())
	// The bound is the point: 4 intervals as documented, plus one for a
	// metric scrape and a loaded host.
	assert.Less(t, took, 5*interval, "take-over after the renewer was killed")
}
