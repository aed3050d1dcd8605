package daemon_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// Failover tests: a cached token bucket, fail = "open", hammered at 5×
// its limit through three daemons while a Redis primary dies and its
// replica takes over.
const (
	failoverLimit  = 40
	failoverPeriod = 500 * time.Millisecond
)

func failoverConfig(store string) string {
	return fmt.Sprintf(`[server]
max_connections = 1000

[store]
%s
timeout = %q

[[rule]]
name = "fo"
by = ["api_key"]
limit = %d
period = %q
fail = "open"
`, store, fleetTimeout, failoverLimit, failoverPeriod)
}

// failoverKey is one key hammered through a failover, and what its
// answers were.
type failoverKey struct {
	apiKey string

	admitted, limited, errs atomic.Int64
	degraded                atomic.Int64 // degraded answers, allowed or not
	firstErr                atomic.Pointer[string]
	first, last             atomic.Int64 // unix µs: first send, last answer
	degFirst, degLast       atomic.Int64 // unix µs: first and last degraded answer
}

// bound is the exact token-bucket bound over the run plus what fail-open
// allows while degraded: the fleet's fair shares add up to the limit, so
// over a degraded span D the daemons admit at most a capacity and D's
// refill more (and what Redis admitted but had not replicated when its
// primary died, which the replica does not know of: at most one period's
// worth here).
func (k *failoverKey) bound() (exact, withOutage int64) {
	p := algo.Params{Kind: algo.TokenBucket, Limit: failoverLimit, Period: failoverPeriod}
	per := p.PeriodMicros()
	exact = p.Capacity() + (k.last.Load()-k.first.Load())*p.Limit/per
	withOutage = exact
	if k.degraded.Load() > 0 {
		span := k.degLast.Load() - k.degFirst.Load()
		withOutage += p.Capacity() + span*p.Limit/per + p.Limit
	}
	return exact, withOutage
}

// hammerFailover offers every key 5× its limit through every daemon
// socket until stop, recording the answers.
func hammerFailover(t *testing.T, sockets []string, keys []*failoverKey, stop <-chan struct{}) {
	t.Helper()
	var wg sync.WaitGroup
	perKey := len(sockets) * 2 // two connections per daemon and key
	interval := time.Duration(float64(failoverPeriod) * float64(perKey) / (5 * failoverLimit))
	for _, k := range keys {
		for _, sock := range sockets {
			for range 2 {
				c := client.New(sock)
				t.Cleanup(func() { c.Close() })
				wg.Go(func() {
					descs := []client.Descriptor{{Name: "api_key", Value: k.apiKey}}
					for next := time.Now(); ; next = next.Add(interval) {
						select {
						case <-stop:
							return
						case <-time.After(time.Until(next)): // pacing the load
						}
						storeMin(&k.first, time.Now().UnixMicro())
						ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
						r, err := c.Check(ctx, descs, 1)
						cancel()
						now := time.Now().UnixMicro()
						storeMax(&k.last, now)
						switch {
						case err != nil || (!r.Allowed() && r.RetryAfter <= 0):
							if k.errs.Add(1) == 1 {
								msg := fmt.Sprintf("%v %+v", err, r)
								k.firstErr.Store(&msg)
							}
							continue
						case r.Allowed():
							k.admitted.Add(1)
						default:
							k.limited.Add(1)
						}
						if r.Degraded {
							k.degraded.Add(1)
							storeMin(&k.degFirst, now)
							storeMax(&k.degLast, now)
						}
					}
				})
			}
		}
	}
	<-stop
	wg.Wait()
}

// checkFailover asserts the failover criteria for keys: no errors; the
// keys of shards that did not fail are never degraded and stay within the
// exact bound; the failed shard's key is degraded no longer than the
// failover took (from killed) plus grace, and within the bound plus what
// fail-open allows.
func checkFailover(t *testing.T, keys []*failoverKey, failed *failoverKey, killed time.Time, failover, grace time.Duration) {
	t.Helper()
	since := func(us int64) time.Duration {
		return (time.Duration(us-killed.UnixMicro()) * time.Microsecond).Round(time.Millisecond)
	}
	t.Logf("failover complete %v after the kill; key %s degraded from %v to %v after it",
		failover.Round(time.Millisecond), failed.apiKey, since(failed.degFirst.Load()), since(failed.degLast.Load()))
	for _, k := range keys {
		exact, withOutage := k.bound()
		span := time.Duration(k.degLast.Load()-k.degFirst.Load()) * time.Microsecond
		t.Logf("key %-8s admitted %4d, limited %5d, errors %d, degraded %4d over %v; exact bound %d, with the outage's fair share %d",
			k.apiKey, k.admitted.Load(), k.limited.Load(), k.errs.Load(), k.degraded.Load(), span.Round(time.Millisecond), exact, withOutage)
		if p := k.firstErr.Load(); p != nil {
			t.Errorf("key %s: %d errors; first: %s", k.apiKey, k.errs.Load(), *p)
		}
		if k != failed {
			assert.Zero(t, k.degraded.Load(), "key %s: its shard did not fail", k.apiKey)
			assert.LessOrEqual(t, k.admitted.Load(), exact, "key %s", k.apiKey)
			continue
		}
		assert.LessOrEqual(t, span, failover+grace, "key %s: degraded for longer than the failover (%v) and %v", k.apiKey, failover, grace)
		assert.LessOrEqual(t, k.admitted.Load(), withOutage, "key %s", k.apiKey)
	}
}

// TestClusterFailover: kill a primary of the 3+3 Cluster under load.
// Keys on the other shards keep exact enforcement; the key on the failed
// shard is degraded for no longer than the failover plus half a second,
// then exact again.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.AllowPartialCoverage())
	var keys []*failoverKey
	for _, primary := range cl.Primaries() {
		for i := 0; ; i++ {
			require.Less(t, i, 1000)
			v := fmt.Sprintf("fo_%d", i)
			if cl.PrimaryFor(string(redisx.AppendKey(nil, "rld:", counterKey("fo", v), algo.TokenBucket))) == primary {
				keys = append(keys, &failoverKey{apiKey: v})
				break
			}
		}
	}
	store := clusterStore(cl)
	cfg := failoverConfig(store)
	var sockets []string
	for range 3 {
		sockets = append(sockets, start(t, cfg).Socket)
	}

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); hammerFailover(t, sockets, keys, stop) }()
	time.Sleep(2 * failoverPeriod) // load before the fault
	victim := cl.PrimaryFor(string(redisx.AppendKey(nil, "rld:", counterKey("fo", keys[0].apiKey), algo.TokenBucket)))
	killed := time.Now()
	victim.Kill()
	cl.WaitFailover(t, victim)
	failover := time.Since(killed)
	time.Sleep(2 * time.Second) // load after the failover
	close(stop)
	<-done
	// The daemons' slot maps name the promoted replica within about a
	// refresh gap (100 ms) of the cluster agreeing on it, and their calls
	// follow their maps: half a second is room for a loaded machine.
	checkFailover(t, keys, keys[0], killed, failover, 500*time.Millisecond)
	// Exact again afterwards: the last degraded answer came before the
	// load stopped by more than a second.
	assert.Less(t, keys[0].degLast.Load(), keys[0].last.Load()-int64(time.Second/time.Microsecond), "still degraded at the end")
}

// TestSentinelFailover: kill the Sentinel primary under load; the store
// follows the promoted replica, and the key is degraded for no longer than
// the failover plus a second, then exact again.
func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	g := redistest.StartSentinel(t)
	// A sentinel named as a standalone server is refused.
	_, err := daemontest.Start(fleetConfig(fmt.Sprintf("redis = [%q]", g.SentinelAddrs()[0]), 10, "strict"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "reports redis_mode sentinel: it is a sentinel")
	addrs := quotedList(g.SentinelAddrs())
	cfg := failoverConfig(fmt.Sprintf("redis = [%s]\nmode = \"sentinel\"\nmaster_set = %q", addrs, g.MasterSet))
	var sockets []string
	for range 3 {
		sockets = append(sockets, start(t, cfg).Socket)
	}
	keys := []*failoverKey{{apiKey: "fo_sentinel"}}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); hammerFailover(t, sockets, keys, stop) }()
	time.Sleep(2 * failoverPeriod)
	killed := time.Now()
	g.Primary().Kill()
	g.WaitFailover(t)
	failover := time.Since(killed)
	time.Sleep(2 * time.Second)
	close(stop)
	<-done
	checkFailover(t, keys, keys[0], killed, failover, time.Second)
	assert.Less(t, keys[0].degLast.Load(), keys[0].last.Load()-int64(time.Second/time.Microsecond), "still degraded at the end")
}
