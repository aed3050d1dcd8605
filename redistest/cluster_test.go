package redistest

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestClusterFailover starts a Cluster, checks the slot map against the
// servers, kills the primary of a key and times the failover.
func TestClusterFailover(t *testing.T) {
	start := time.Now()
	c := StartCluster(t, AllowPartialCoverage())
	t.Logf("cluster ready in %s", time.Since(start).Round(time.Millisecond))

	primaries := c.Primaries()
	if len(primaries) != 3 || len(c.Addrs()) != 6 {
		t.Fatalf("%d primaries, %d nodes; want 3, 6", len(primaries), len(c.Addrs()))
	}
	for _, n := range c.Nodes() {
		if len(n.ID) != 40 {
			t.Errorf("node %s: ID %q", n.Addr, n.ID)
		}
		switch n.Role {
		case RolePrimary:
			if n.Primary != nil || !containsServer(primaries, n.Server) {
				t.Errorf("primary %s: Primary %v, serves slots %v", n.Addr, n.Primary, containsServer(primaries, n.Server))
			}
		case RoleReplica:
			if !containsServer(primaries, n.Primary) {
				t.Errorf("replica %s replicates %v, not a primary", n.Addr, n.Primary)
			}
		default:
			t.Errorf("node %s: role %q", n.Addr, n.Role)
		}
	}
	for _, key := range []string{"foo", "rl:{tenant-7}:search", "{}", "{}{a}", "a{b}c{d}", "}{x}", "\xff\x00"} {
		if got, err := Do(c.Addrs()[0], "CLUSTER", "KEYSLOT", key); err != nil || got != strconv.Itoa(Slot(key)) {
			t.Errorf("CLUSTER KEYSLOT %q = %s, %v; Slot = %d", key, got, err, Slot(key))
		}
	}
	if got, err := Do(c.Addrs()[0], "CONFIG", "GET", "cluster-require-full-coverage"); err != nil || !strings.HasSuffix(got, "\nno") {
		t.Errorf("cluster-require-full-coverage = %q, %v", got, err)
	}

	const key = "rl:{tenant-1}"
	p := c.PrimaryFor(key)
	setAndWait(t, p.Addr, key, "v1")
	for _, other := range primaries {
		if other == p {
			continue
		}
		want := fmt.Sprintf("MOVED %d %s", Slot(key), p.Addr)
		if _, err := Do(other.Addr, "GET", key); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("GET on %s: %v, want %s", other.Addr, err, want)
		}
	}

	// A key on another shard stays writable throughout: partial coverage.
	otherKey := keyNotOn(c, p)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := Do(c.PrimaryFor(otherKey).Addr, "INCR", otherKey); err != nil {
				writeErr = err
				return
			}
		}
	})

	p.Kill()
	killed := time.Now()
	promoted := c.WaitFailover(t, p)
	t.Logf("failover in %s: %s took over from %s", time.Since(killed).Round(time.Millisecond), promoted.Addr, p.Addr)
	close(stop)
	wg.Wait()
	if writeErr != nil {
		t.Errorf("write to another shard during the failover: %v", writeErr)
	}

	if c.PrimaryFor(key) != promoted || promoted == p {
		t.Errorf("PrimaryFor(%q) = %s, promoted %s, killed %s", key, addr(c.PrimaryFor(key)), promoted.Addr, p.Addr)
	}
	if got, err := Do(promoted.Addr, "GET", key); err != nil || got != "v1" {
		t.Errorf("GET on the promoted replica = %q, %v", got, err)
	}
	for _, n := range c.Nodes() {
		if n.Server == p && n.Role != RoleFailed {
			t.Errorf("killed node %s has role %q", p.Addr, n.Role)
		}
	}
}

func containsServer(ss []*Server, s *Server) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// keyNotOn returns a key that p does not serve.
func keyNotOn(c *Cluster, p *Server) string {
	for i := 0; ; i++ {
		if k := "other-" + strconv.Itoa(i); c.PrimaryFor(k) != p {
			return k
		}
	}
}

// setAndWait sets key on addr and waits on the same connection (WAIT
// counts acknowledgements of the connection's own writes) until one
// replica has the write.
func setAndWait(t *testing.T, addr, key, value string) {
	t.Helper()
	vs, err := pipeline(addr, doTimeout, []string{"SET", key, value}, []string{"WAIT", "1", "5000"})
	if err != nil || vs[0] != "OK" || vs[1] != int64(1) {
		t.Fatalf("SET %s then WAIT 1 on %s = %v, %v; want OK, 1", key, addr, vs, err)
	}
}
