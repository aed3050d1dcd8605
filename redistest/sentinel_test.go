package redistest

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSentinelFailover starts a Sentinel group, kills the primary and times
// until the first and then every sentinel reports the replica as master.
func TestSentinelFailover(t *testing.T) {
	start := time.Now()
	g := StartSentinel(t)
	t.Logf("sentinel group ready in %s", time.Since(start).Round(time.Millisecond))

	if g.MasterSet != "mymaster" || len(g.SentinelAddrs()) != 3 {
		t.Fatalf("MasterSet %q, %d sentinels", g.MasterSet, len(g.SentinelAddrs()))
	}
	old, replica := g.Primary(), g.Replica()
	setAndWait(t, old.Addr, "k", "v1")

	old.Kill()
	killed := time.Now()
	WaitFor(t, "a sentinel to report the replica as master", func() bool {
		for _, a := range g.SentinelAddrs() {
			got, err := Do(a, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.MasterSet)
			if err == nil && strings.HasSuffix(got, "\n"+strconv.Itoa(replica.Port)) {
				return true
			}
		}
		return false
	})
	first := time.Since(killed)
	p := g.WaitFailover(t)
	t.Logf("failover: first sentinel switched in %s, all in %s",
		first.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	if p != replica || g.Primary() != replica || g.Replica() != old {
		t.Errorf("after failover: returned %s, Primary %s, Replica %s; want %s, %s, %s",
			p.Addr, g.Primary().Addr, g.Replica().Addr, replica.Addr, replica.Addr, old.Addr)
	}
	if got, err := Do(p.Addr, "GET", "k"); err != nil || got != "v1" {
		t.Errorf("GET on the new primary = %q, %v", got, err)
	}
	if got, err := Do(p.Addr, "SET", "k", "v2"); err != nil || got != "OK" {
		t.Errorf("SET on the new primary = %q, %v", got, err)
	}
}
