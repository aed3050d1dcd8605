package daemon_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/wire"
)

// restoreLine is the start of the message of the daemon that finds
// Redis has lost the fleet's changes and begins their restore.
const restoreLine = "redis lost the fleet's overrides and blocks"

// startMetricsFleet runs n daemon processes of configuration cfg, each
// serving HTTP (for /metrics) on a free port; it returns them and their
// HTTP addresses.
func startMetricsFleet(t *testing.T, cfg string, n int) ([]*daemontest.Process, []string) {
	t.Helper()
	var ps []*daemontest.Process
	var https []string
	for range n {
		h := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t, 0))
		p, err := daemontest.StartProcess(cfg, "-http", h)
		require.NoError(t, err)
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("daemon log:\n%s", p.Logs())
			}
			p.Close()
		})
		ps, https = append(ps, p), append(https, h)
	}
	return ps, https
}

// scrapeMetric returns the value of series on the daemon whose HTTP
// address is h (0 when it is not exposed).
func scrapeMetric(t *testing.T, h, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + h + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	return 0
}

// liveSet returns every override and block in force on the daemon at
// socket, by id.
func liveSet(t *testing.T, socket string) map[string]any {
	all := listAll(t, socket)
	out := map[string]any{}
	for _, o := range all.Overrides {
		out[o.ID] = o
	}
	for _, b := range all.Blocks {
		out[b.ID] = b
	}
	return out
}

// blockSampler checks keys on each daemon every 10 ms until stopped and
// counts the checks that were not refused as blocked.
type blockSampler struct {
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	checks  atomic.Int64
	through atomic.Int64 // answered, and not blocked
	failed  atomic.Int64 // no answer
	first   atomic.Value // the first check let through: a string
}

func sampleBlocks(ps []*daemontest.Process, keys []string) *blockSampler {
	s := &blockSampler{stop: make(chan struct{})}
	for i, p := range ps {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			c := client.New(p.Socket)
			defer c.Close()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				for _, k := range keys {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					res, err := c.Check(ctx, []client.Descriptor{{Name: "api_key", Value: k}}, 1)
					cancel()
					s.checks.Add(1)
					switch {
					case err != nil:
						s.failed.Add(1)
					case res.Status != wire.StatusBlocked:
						s.through.Add(1)
						s.first.CompareAndSwap(nil, fmt.Sprintf("daemon %d, key %s: status %v at %s", i, k, res.Status, time.Now().Format(time.StampMilli)))
					}
				}
				select {
				case <-s.stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
	return s
}

func (s *blockSampler) end() {
	s.once.Do(func() { close(s.stop) })
	s.wg.Wait()
}

// TestChangesRestoreAfterRedisRestart: three daemon processes on a Redis
// without persistence. 20 overrides and 10 blocks (some glob) are set
// through the three daemons, one override and one block deleted, some
// expire. Redis is SIGKILLed and started empty on the same port: within
// 2 s of Redis answering, every daemon has the same set in force as
// before (ids, authors, expiries) and Redis holds it again; the deleted
// ones stay deleted and the expired ones are not brought back; the
// blocked keys are refused at every check during the run (each daemon,
// every 10 ms); one daemon logs and counts that it began the restore.
func TestChangesRestoreAfterRedisRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t) // --save '' --appendonly no
	ps, https := startMetricsFleet(t, fleetChangeConfig(srv.Addr), 3)
	short := map[string]bool{}
	var deleted []string
	for i := range 20 {
		args := admin.OverrideArgs{Rule: "per-key", Limit: int64(100 + i), TTL: "1h", Author: fmt.Sprintf("ops-%d", i), Reason: "restore test"}
		if i%4 == 0 {
			args.Match = map[string]string{"api_key": fmt.Sprintf("team-%d-*", i)}
		} else {
			args.Key = map[string]string{"api_key": fmt.Sprintf("k-%d", i)}
		}
		if i%7 == 3 {
			args.TTL = "2s"
		}
		var o admin.OverrideEntry
		require.Nil(t, changeCall(t, ps[i%3].Socket, "override-set", args, &o))
		if args.TTL == "2s" {
			short[o.ID] = true
		}
		if i == 5 {
			deleted = append(deleted, o.ID)
		}
	}
	var blocked []string // keys that stay blocked
	for i := range 10 {
		args := admin.BlockArgs{TTL: "1h", Author: fmt.Sprintf("sec-%d", i), Reason: "abuse"}
		key := fmt.Sprintf("abuser-%d", i)
		if i%3 == 0 {
			args.Match = map[string]string{"api_key": fmt.Sprintf("bot-%d-*", i)}
			key = fmt.Sprintf("bot-%d-x", i)
		} else {
			args.Rule, args.Key = "per-key", map[string]string{"api_key": key}
		}
		if i == 8 {
			args.TTL = "2s"
		}
		var b admin.BlockEntry
		require.Nil(t, changeCall(t, ps[(i+1)%3].Socket, "block", args, &b))
		switch i {
		case 8:
			short[b.ID] = true
		case 4:
			deleted = append(deleted, b.ID)
		default:
			blocked = append(blocked, key)
		}
	}
	require.Nil(t, changeCall(t, ps[1].Socket, "override-delete", admin.IDArgs{ID: deleted[0]}, nil))
	require.Nil(t, changeCall(t, ps[2].Socket, "unblock", admin.IDArgs{ID: deleted[1]}, nil))
	require.Len(t, short, 4)

	// The expected set: what is left once the short ones expire, the
	// same on the three daemons.
	var want map[string]any
	untilAll(t, 3, 10*time.Second, func(d int) bool {
		got := liveSet(t, ps[d].Socket)
		for id := range short {
			if got[id] != nil {
				return false
			}
		}
		if d == 0 && len(got) == 20+10-2-4 {
			want = got
		}
		return len(got) == 20+10-2-4
	})
	require.NotNil(t, want)
	for i := range ps {
		require.Equal(t, want, liveSet(t, ps[i].Socket), "daemon %d before the restart", i)
	}

	samp := sampleBlocks(ps, blocked[:3])
	defer samp.end()
	redistest.WaitFor(t, "the samplers to run", func() bool { return samp.checks.Load() >= 30 })
	logsBefore := make([]int, len(ps))
	for i, p := range ps {
		logsBefore[i] = len(p.Logs())
	}
	srv.Kill()
	srv.Start(t) // empty: no persistence
	up := time.Now()
	// The 24 entries, the 2 tombstones, the version and the epoch.
	deadline := up.Add(2 * time.Second)
	for {
		n, err := redistest.Do(srv.Addr, "HLEN", changesKey)
		if err == nil && n == "28" {
			break
		}
		require.True(t, time.Now().Before(deadline), "Redis does not hold the changes again within 2s of answering (HLEN %s, %v)", n, err)
		time.Sleep(time.Millisecond) // polling a condition
	}
	t.Logf("the changes back in Redis %s after it answered", time.Since(up).Round(time.Millisecond))
	for i := range ps {
		assert.Equal(t, want, liveSet(t, ps[i].Socket), "daemon %d after the restore", i)
	}
	// Redis holds them again, not only the daemons' copies: a fourth
	// daemon started now loads the same set.
	late, err := daemontest.StartProcess(fleetChangeConfig(srv.Addr))
	require.NoError(t, err)
	defer late.Close()
	redistest.WaitFor(t, "the late daemon to load the set", func() bool {
		return assert.ObjectsAreEqual(want, liveSet(t, late.Socket))
	})
	for _, id := range deleted {
		n, err := redistest.Do(srv.Addr, "HEXISTS", changesKey, id)
		require.NoError(t, err)
		assert.Equal(t, "0", n, "deleted %s is not brought back", id)
	}
	for id := range short {
		n, err := redistest.Do(srv.Addr, "HEXISTS", changesKey, id)
		require.NoError(t, err)
		assert.Equal(t, "0", n, "expired %s is not brought back", id)
	}

	// Blocks never lapsed: checks go on a moment after the restore.
	n := samp.checks.Load()
	redistest.WaitFor(t, "more checks after the restore", func() bool { return samp.checks.Load() >= n+30 })
	samp.end()
	t.Logf("blocked keys: %d checks on 3 daemons, %d not answered (Redis down), %d let through", samp.checks.Load(), samp.failed.Load(), samp.through.Load())
	assert.Zero(t, samp.through.Load(), "a blocked key was let through: %v", samp.first.Load())

	// The live daemons stay counted 3 while they beat again one by one
	// on the empty Redis (a heartbeat's ttl after the restart).
	time.Sleep(2 * time.Second) // the heartbeats of the seconds after the restart: nothing to poll for
	for i, p := range ps {
		after := p.Logs()[logsBefore[i]:]
		assert.NotContains(t, after, "daemons=1", "daemon %d", i)
		assert.NotContains(t, after, "daemons=2", "daemon %d", i)
	}

	var began, joined float64
	lines := 0
	for i := range ps {
		began += scrapeMetric(t, https[i], `rld_changes_restores_total{role="began"}`)
		joined += scrapeMetric(t, https[i], `rld_changes_restores_total{role="joined"}`)
		lines += strings.Count(ps[i].Logs(), restoreLine+" (restarted")
	}
	assert.Equal(t, 1.0, began, "one daemon began the restore")
	assert.Equal(t, 1, lines, "it logged it once")
	assert.LessOrEqual(t, joined, 2.0, "the others joined it at most once each")
	assert.True(t, slices.ContainsFunc(ps, func(p *daemontest.Process) bool {
		return strings.Contains(p.Logs(), "level=ERROR") && strings.Contains(p.Logs(), "written_back=")
	}), "logged at ERROR with counts")
}

// TestChangesRestoreAfterLostWrites: Redis goes back to an older copy of
// the changes' hash with the same epoch, as a replica that missed the
// last writes does once a failover promotes it (here by DUMP before the
// last writes and RESTORE after them). The daemons find the version
// lower and write back what it lacks: the override set since is in force
// again and in Redis, the block deleted since stays deleted; one daemon
// logs and counts it.
func TestChangesRestoreAfterLostWrites(t *testing.T) {
	srv := redistest.Standalone(t)
	ps, https := startMetricsFleet(t, fleetChangeConfig(srv.Addr), 3)
	var kept, lost admin.OverrideEntry
	require.Nil(t, changeCall(t, ps[0].Socket, "override-set",
		admin.OverrideArgs{Rule: "per-key", Key: map[string]string{"api_key": "a"}, Limit: 5, TTL: "1h", Author: "ops"}, &kept))
	var b admin.BlockEntry
	require.Nil(t, changeCall(t, ps[1].Socket, "block",
		admin.BlockArgs{Rule: "per-key", Key: map[string]string{"api_key": "bad"}, TTL: "1h", Author: "sec"}, &b))
	untilAll(t, 3, 5*time.Second, func(d int) bool { return len(liveSet(t, ps[d].Socket)) == 2 })
	dump, err := redistest.Do(srv.Addr, "DUMP", changesKey)
	require.NoError(t, err)

	require.Nil(t, changeCall(t, ps[2].Socket, "override-set",
		admin.OverrideArgs{Rule: "per-key", Key: map[string]string{"api_key": "b"}, Limit: 7, TTL: "1h", Author: "ops-2"}, &lost))
	require.Nil(t, changeCall(t, ps[0].Socket, "unblock", admin.IDArgs{ID: b.ID}, nil))
	var want map[string]any
	untilAll(t, 3, 5*time.Second, func(d int) bool {
		got := liveSet(t, ps[d].Socket)
		if d == 0 {
			want = got
		}
		return len(got) == 2 && got[lost.ID] != nil
	})

	_, err = redistest.Do(srv.Addr, "RESTORE", changesKey, "0", dump, "REPLACE")
	require.NoError(t, err)
	redistest.WaitFor(t, "the lost override back in Redis", func() bool {
		n, err := redistest.Do(srv.Addr, "HEXISTS", changesKey, lost.ID)
		return err == nil && n == "1"
	})
	n, err := redistest.Do(srv.Addr, "HEXISTS", changesKey, b.ID)
	require.NoError(t, err)
	assert.Equal(t, "0", n, "the block deleted in the lost writes stays deleted")
	for i := range ps {
		assert.Equal(t, want, liveSet(t, ps[i].Socket), "daemon %d", i)
	}
	var began float64
	for i := range ps {
		began += scrapeMetric(t, https[i], `rld_changes_restores_total{role="began"}`)
	}
	assert.Equal(t, 1.0, began, "one daemon found the writes lost and restored them")
}

// TestChangesRestoreAfterSentinelFailover: three daemons on a Sentinel
// primary and replica. The replica stops replicating (REPLICAOF a dead
// port) before an override is set and a block lifted; the primary is
// killed and the sentinels promote the replica, which lacks both writes.
// The daemons find the version lower and write their set back: the
// override is in Redis and in force again, the block stays lifted, and
// one daemon counts that it began the restore.
func TestChangesRestoreAfterSentinelFailover(t *testing.T) {
	t.Parallel()
	g := redistest.StartSentinel(t)
	cfg := fleetChangeConfig("")
	cfg = strings.Replace(cfg, `redis = [""]`, fmt.Sprintf("redis = [%s]\nmode = \"sentinel\"\nmaster_set = %q", quotedList(g.SentinelAddrs()), g.MasterSet), 1)
	ps, https := startMetricsFleet(t, cfg, 3)
	var kept admin.OverrideEntry
	var b admin.BlockEntry
	require.Nil(t, changeCall(t, ps[0].Socket, "override-set",
		admin.OverrideArgs{Rule: "per-key", Key: map[string]string{"api_key": "a"}, Limit: 5, TTL: "1h", Author: "ops"}, &kept))
	require.Nil(t, changeCall(t, ps[1].Socket, "block",
		admin.BlockArgs{Rule: "per-key", Key: map[string]string{"api_key": "bad"}, TTL: "1h", Author: "sec"}, &b))
	redistest.WaitFor(t, "the replica to have both", func() bool {
		n, err := redistest.Do(g.Replica().Addr, "HLEN", changesKey)
		return err == nil && n == "4" // two entries, the version, the epoch
	})
	// The replica misses what follows.
	_, err := redistest.Do(g.Replica().Addr, "REPLICAOF", "127.0.0.1", strconv.Itoa(redistest.FreePort(t, 0)))
	require.NoError(t, err)
	var lost admin.OverrideEntry
	require.Nil(t, changeCall(t, ps[2].Socket, "override-set",
		admin.OverrideArgs{Rule: "per-key", Key: map[string]string{"api_key": "b"}, Limit: 7, TTL: "1h", Author: "ops-2"}, &lost))
	require.Nil(t, changeCall(t, ps[0].Socket, "unblock", admin.IDArgs{ID: b.ID}, nil))
	var want map[string]any
	untilAll(t, 3, 5*time.Second, func(d int) bool {
		got := liveSet(t, ps[d].Socket)
		if d == 0 {
			want = got
		}
		return len(got) == 2 && got[lost.ID] != nil && got[kept.ID] != nil
	})
	n, err := redistest.Do(g.Replica().Addr, "HEXISTS", changesKey, lost.ID)
	require.NoError(t, err)
	require.Equal(t, "0", n, "the replica missed the override")

	g.Primary().Kill()
	promoted := g.WaitFailover(t)
	redistest.WaitFor(t, "the lost override back in the promoted replica", func() bool {
		n, err := redistest.Do(promoted.Addr, "HEXISTS", changesKey, lost.ID)
		return err == nil && n == "1"
	})
	n, err = redistest.Do(promoted.Addr, "HEXISTS", changesKey, b.ID)
	require.NoError(t, err)
	assert.Equal(t, "0", n, "the block lifted in the lost writes stays lifted")
	for i := range ps {
		assert.Equal(t, want, liveSet(t, ps[i].Socket), "daemon %d", i)
		assert.Equal(t, wire.StatusAllowed, checkStatus(t, clients(t, ps[i:i+1])[0], "bad"), "daemon %d: unblocked", i)
	}
	var began float64
	for i := range ps {
		began += scrapeMetric(t, https[i], `rld_changes_restores_total{role="began"}`)
	}
	assert.Equal(t, 1.0, began, "one daemon found the writes lost and restored them")
}
