package redisx_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/lua"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// infoInt returns the integer field of INFO section at addr.
func infoInt(t *testing.T, addr, section, field string) int64 {
	t.Helper()
	info, err := redistest.Do(addr, "INFO", section)
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err, line)
			return n
		}
	}
	return 0
}

// cmdCalls returns how many times addr ran command since its stats were
// reset (INFO commandstats).
func cmdCalls(t *testing.T, addr, command string) int64 {
	t.Helper()
	info, err := redistest.Do(addr, "INFO", "commandstats")
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":calls="); ok {
			n, err := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
			require.NoError(t, err, line)
			return n
		}
	}
	return 0
}

// cmdUsec returns how many µs addr spent running command since its stats
// were reset (INFO commandstats).
func cmdUsec(t *testing.T, addr, command string) int64 {
	t.Helper()
	info, err := redistest.Do(addr, "INFO", "commandstats")
	require.NoError(t, err)
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":"); ok {
			for f := range strings.SplitSeq(v, ",") {
				if u, ok := strings.CutPrefix(f, "usec="); ok {
					n, err := strconv.ParseInt(u, 10, 64)
					require.NoError(t, err, line)
					return n
				}
			}
		}
	}
	return 0
}

// TestDo: leases, peeks and returns of every algorithm in batches, with
// invalid ops among them, against what the single calls do.
func TestDo(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()

	var ops []algo.Op
	for _, k := range kinds {
		p := algo.Params{Kind: k, Limit: 10, Period: time.Hour}
		key := []byte("do\x00" + k.String())
		ops = append(ops,
			algo.Op{Kind: algo.OpLease, Key: key, Params: p, N: 4},
			// The same key, later in the same pipeline: after the lease.
			algo.Op{Kind: algo.OpPeek, Key: key, Params: p, N: 6},
			algo.Op{Kind: algo.OpPeek, Key: key, Params: p, N: 7},
			algo.Op{Kind: algo.OpLease, Key: key, Params: p, N: 100},
			algo.Op{Kind: algo.OpLease, Key: key, Params: p, N: 1},
		)
	}
	ops = append(ops,
		algo.Op{Kind: algo.OpPeek, Key: []byte("bad"), Params: algo.Params{Limit: 0, Period: time.Second}, N: 1},
		algo.Op{Kind: algo.NumOpKinds, Key: []byte("bad"), Params: algo.Params{Limit: 1, Period: time.Second}, N: 1},
		algo.Op{Kind: algo.OpRefund, Key: []byte("bad"), Params: algo.Params{Limit: 1, Period: time.Second}, N: 0},
	)
	require.NoError(t, rs.Do(ctx, ops))
	for i, k := range kinds {
		o := ops[5*i : 5*i+5]
		for j := range o {
			require.NoError(t, o[j].Err, "%s op %d", k, j)
			assert.Equal(t, int64(10), o[j].Result.Limit)
			assert.Positive(t, o[j].Result.At)
		}
		assert.Equal(t, int64(4), o[0].Granted, k.String())
		assert.True(t, o[0].Result.Allowed, k.String())
		assert.Equal(t, int64(6), o[0].Result.Remaining, k.String())
		assert.True(t, o[1].Result.Allowed, "%s: 6 of 6 left fit", k)
		assert.Zero(t, o[1].Granted)
		assert.False(t, o[2].Result.Allowed, "%s: 7 of 6 left do not", k)
		assert.Equal(t, int64(6), o[3].Granted, "%s: a lease grants what is left", k)
		assert.Equal(t, int64(0), o[3].Result.Remaining, k.String())
		assert.Zero(t, o[4].Granted, k.String())
		assert.False(t, o[4].Result.Allowed, k.String())
		assert.Positive(t, o[4].Result.RetryAfter, k.String())
	}
	bad := ops[len(ops)-3:]
	for _, o := range bad {
		require.Error(t, o.Err)
		assert.Contains(t, o.Err.Error(), `"t:{bad}:tb"`)
	}

	// Return the units of the first lease of each key, then peek.
	var back []algo.Op
	for i := range kinds {
		lease := ops[5*i]
		back = append(back,
			algo.Op{Kind: algo.OpRefund, Key: lease.Key, Params: lease.Params, N: 3, TakenAt: lease.Result.At},
			algo.Op{Kind: algo.OpPeek, Key: lease.Key, Params: lease.Params, N: 3},
		)
	}
	require.NoError(t, rs.Do(ctx, back))
	for i := 0; i < len(back); i += 2 {
		k := back[i].Params.Kind
		require.NoError(t, back[i].Err, k.String())
		require.NoError(t, back[i+1].Err, k.String())
		assert.Equal(t, int64(2), back[i].Result.Remaining, "%s: a peek of 1 after 3 came back", k)
		assert.False(t, back[i].Result.Allowed, "%s: a return decides nothing", k)
		assert.True(t, back[i+1].Result.Allowed, "%s: 3 units came back", k)
	}

	// Outputs are reset on reuse.
	require.NoError(t, rs.Do(ctx, bad))
	assert.Error(t, bad[0].Err)
	require.NoError(t, rs.Do(ctx, nil))
}

// TestDoOneRoundTrip: a Do of 200 ops is 200 commands and a handful of
// reads by Redis (one pipeline), where 200 single calls are 200 reads.
func TestDoOneRoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()
	const n = 200
	ops := make([]algo.Op, n)
	for i := range ops {
		ops[i] = algo.Op{Kind: [...]algo.OpKind{algo.OpPeek, algo.OpLease, algo.OpRefund}[i%3], Key: []byte(fmt.Sprintf("rt-%d", i%50)),
			Params: algo.Params{Kind: kinds[i%len(kinds)], Limit: 1000, Period: time.Minute}, N: 2, TakenAt: time.Now().UnixMicro()}
	}
	require.NoError(t, rs.Do(ctx, ops)) // warm: connections up, scripts loaded
	for i := range ops {
		require.NoError(t, ops[i].Err, "op %d", i)
	}

	_, err := redistest.Do(srv.Addr, "CONFIG", "RESETSTAT")
	require.NoError(t, err)
	reads := infoInt(t, srv.Addr, "stats", "total_reads_processed")
	start := time.Now()
	require.NoError(t, rs.Do(ctx, ops))
	doTime := time.Since(start)
	doReads := infoInt(t, srv.Addr, "stats", "total_reads_processed") - reads - 1 // the INFO's read
	for i := range ops {
		require.NoError(t, ops[i].Err, "op %d", i)
	}
	assert.Equal(t, int64(n), cmdCalls(t, srv.Addr, "evalsha"), "one EVALSHA per op, nothing else")
	assert.Zero(t, cmdCalls(t, srv.Addr, "script"))
	assert.Less(t, doReads, int64(20), "Redis read the batch in a few reads, not one per op")

	reads = infoInt(t, srv.Addr, "stats", "total_reads_processed")
	start = time.Now()
	for i := range n {
		o := ops[i]
		_, _, err := rs.Lease(ctx, o.Key, o.Params, o.N)
		require.NoError(t, err)
	}
	seqTime := time.Since(start)
	seqReads := infoInt(t, srv.Addr, "stats", "total_reads_processed") - reads - 1
	assert.GreaterOrEqual(t, seqReads, int64(n))
	t.Logf("%d ops: one Do took %s and %d reads by Redis; %d sequential calls took %s and %d reads",
		n, doTime, doReads, n, seqTime, seqReads)

	// A client whose Timeout is far too short for big batches: ctx's
	// deadline bounds a Do instead.
	rsBig := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, Timeout: time.Millisecond}))
	bigCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, size := range []int{1000, 2000, 5000} {
		big := make([]algo.Op, size)
		for i := range big {
			big[i] = algo.Op{Kind: [...]algo.OpKind{algo.OpPeek, algo.OpLease}[i%2], Key: []byte(fmt.Sprintf("big-%d", i)),
				Params: algo.Params{Kind: kinds[i%len(kinds)], Limit: 1000, Period: time.Minute}, N: 1}
		}
		require.NoError(t, rsBig.Do(bigCtx, big))
		_, err := redistest.Do(srv.Addr, "CONFIG", "RESETSTAT")
		require.NoError(t, err)
		var best time.Duration
		for range 3 {
			start := time.Now()
			require.NoError(t, rsBig.Do(bigCtx, big))
			if d := time.Since(start); best == 0 || d < best {
				best = d
			}
		}
		for i := range big {
			require.NoError(t, big[i].Err, "%d ops: op %d", size, i)
		}
		t.Logf("a Do of %d ops took %s (best of 3); Redis ran the scripts in %s per Do",
			size, best, time.Duration(cmdUsec(t, srv.Addr, "evalsha")/3)*time.Microsecond)
	}
	// Without a deadline in ctx, the Timeout of 1ms bounds the Do.
	big := make([]algo.Op, 2000)
	for i := range big {
		big[i] = algo.Op{Kind: algo.OpPeek, Key: []byte(fmt.Sprintf("big-%d", i)), Params: algo.Params{Limit: 10, Period: time.Minute}, N: 1}
	}
	start = time.Now()
	require.NoError(t, rsBig.Do(ctx, big))
	assert.ErrorIs(t, big[len(big)-1].Err, context.DeadlineExceeded)
	t.Logf("a Do of %d ops under a 1ms Timeout gave up after %s", len(big), time.Since(start))
}

// TestDoScriptLoss: after SCRIPT FLUSH, a Do loads the scripts on the
// node and sends the ops again; with SCRIPT unavailable, it falls back to
// EVAL. Each op is applied once.
func TestDoScriptLoss(t *testing.T) {
	for _, renamed := range []bool{false, true} {
		t.Run(fmt.Sprintf("script-renamed=%v", renamed), func(t *testing.T) {
			script := "SCRIPT"
			var srv *redistest.Server
			if renamed {
				// SCRIPT LOAD fails: the last resort, EVAL, must run.
				script = "SCRIPTX"
				srv = redistest.Standalone(t, "--rename-command", "SCRIPT", script)
			} else {
				srv = redistest.Standalone(t)
			}
			rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
			ctx := context.Background()
			lease := func(round int) {
				t.Helper()
				var ops []algo.Op
				for _, k := range kinds {
					ops = append(ops, algo.Op{Kind: algo.OpLease, Key: []byte("flush"),
						Params: algo.Params{Kind: k, Limit: 10, Period: time.Hour}, N: 2})
				}
				require.NoError(t, rs.Do(ctx, ops))
				for _, o := range ops {
					require.NoError(t, o.Err, "round %d: %s", round, o.Params.Kind)
					assert.Equal(t, int64(2), o.Granted, "round %d: %s", round, o.Params.Kind)
					assert.Equal(t, 10-2*int64(round+1), o.Result.Remaining, "round %d: %s: applied once", round, o.Params.Kind)
				}
			}
			lease(0) // the scripts are unknown to a new server
			_, err := redistest.Do(srv.Addr, script, "FLUSH")
			require.NoError(t, err)
			lease(1)
			lease(2)
			evals := cmdCalls(t, srv.Addr, "eval")
			if renamed {
				assert.Equal(t, int64(2*len(kinds)), evals, "EVAL after each loss")
			} else {
				assert.Zero(t, evals, "SCRIPT LOAD, then EVALSHA")
			}
		})
	}
}

// TestDoCluster: one Do carries ops for keys on all three primaries; each
// key is decided on its primary; after SCRIPT FLUSH on every node a Do
// still works. Heartbeats from two Stores share one registry.
func TestDoCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: c.Addrs()[:2], Mode: redisx.Cluster}))
	ctx := context.Background()
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Hour}

	perPrimary := map[string][]string{}
	var ops []algo.Op
	for i := 0; len(ops) < 60; i++ {
		key := []byte(fmt.Sprintf("multi-%d", i))
		rkey := string(redisx.AppendKey(nil, "t:", key, p.Kind))
		addr := c.PrimaryFor(rkey).Addr
		if len(perPrimary[addr]) == 20 {
			continue
		}
		perPrimary[addr] = append(perPrimary[addr], rkey)
		ops = append(ops, algo.Op{Kind: algo.OpLease, Key: key, Params: p, N: 3})
	}
	require.Len(t, perPrimary, 3)
	src, _ := lua.Source(p.Kind.String())
	sum := sha1.Sum([]byte(src))
	for _, primary := range c.Primaries() {
		redistest.WaitFor(t, "the client's preload of the scripts", func() bool {
			n, err := redistest.Do(primary.Addr, "SCRIPT", "EXISTS", hex.EncodeToString(sum[:]))
			return err == nil && n == "1"
		})
		_, err := redistest.Do(primary.Addr, "CONFIG", "RESETSTAT")
		require.NoError(t, err)
	}
	require.NoError(t, rs.Do(ctx, ops))
	for i, o := range ops {
		require.NoError(t, o.Err, "op %d", i)
		assert.Equal(t, int64(3), o.Granted)
		assert.Equal(t, int64(7), o.Result.Remaining)
	}
	for addr, keys := range perPrimary {
		for _, rkey := range keys {
			n, err := redistest.Do(addr, "EXISTS", rkey)
			require.NoError(t, err)
			assert.Equal(t, "1", n, "%q on %s", rkey, addr)
		}
		// The scripts were preloaded: one EVALSHA per key.
		assert.Equal(t, int64(len(keys)), cmdCalls(t, addr, "evalsha"), addr)
	}

	for _, node := range c.Nodes() {
		_, err := redistest.Do(node.Addr, "SCRIPT", "FLUSH")
		require.NoError(t, err)
		_, err = redistest.Do(node.Addr, "CONFIG", "RESETSTAT")
		require.NoError(t, err)
	}
	for i := range ops {
		ops[i].Kind, ops[i].N, ops[i].TakenAt = algo.OpRefund, 3, ops[i].Result.At
	}
	require.NoError(t, rs.Do(ctx, ops))
	for i := range ops {
		require.NoError(t, ops[i].Err, "op %d", i)
		assert.Equal(t, int64(9), ops[i].Result.Remaining, "op %d: 3 back, a peek of 1", i)
	}
	for addr, keys := range perPrimary {
		// After the flush the Do met NOSCRIPT: 20 EVALSHA, SCRIPT LOAD,
		// 20 again.
		assert.Equal(t, int64(2*len(keys)), cmdCalls(t, addr, "evalsha"), addr)
	}

	rs2 := redisx.NewStore(newClient(t, redisx.Options{Addrs: c.Addrs()[2:], Mode: redisx.Cluster}))
	live, err := rs.Heartbeat(ctx, "d1", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 1, live)
	live, err = rs2.Heartbeat(ctx, "d2", time.Minute)
	require.NoError(t, err)
	assert.Equal(t, 2, live)
}

// TestDoNotConnected: with no connection, Do fails as a whole and each op
// carries the error.
func TestDoNotConnected(t *testing.T) {
	srv := redistest.Standalone(t)
	c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}})
	c.Close()
	ops := []algo.Op{{Kind: algo.OpPeek, Key: []byte("k"), Params: algo.Params{Limit: 1, Period: time.Second}}}
	err := redisx.NewStore(c).Do(context.Background(), ops)
	require.ErrorIs(t, err, redisx.ErrClosed)
	assert.ErrorIs(t, ops[0].Err, redisx.ErrClosed)
}

// TestDoPausedRedis: a Do against a frozen Redis ends within about the
// timeout, every op with an error.
func TestDoPausedRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	const timeout = 20 * time.Millisecond
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, Timeout: timeout}))
	ops := make([]algo.Op, 50)
	for i := range ops {
		ops[i] = algo.Op{Kind: algo.OpLease, Key: []byte(fmt.Sprint(i)), Params: algo.Params{Limit: 1_000_000, Period: time.Second}, N: 1}
	}
	redistest.WaitFor(t, "a Do within the timeout", func() bool {
		return rs.Do(context.Background(), ops) == nil && ops[0].Err == nil
	})
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	require.NoError(t, rs.Do(context.Background(), ops), "something was sent")
	assert.Less(t, time.Since(start), timeout+200*time.Millisecond)
	for i := range ops {
		assert.ErrorIs(t, ops[i].Err, context.DeadlineExceeded, "op %d", i)
	}
	srv.Resume()
	redistest.WaitFor(t, "a Do to succeed after resume", func() bool {
		return rs.Do(context.Background(), ops) == nil && ops[0].Err == nil
	})
}

func BenchmarkDo(b *testing.B) {
	srv := redistest.Standalone(b)
	rs := redisx.NewStore(newClient(b, redisx.Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second}))
	ops := make([]algo.Op, 500)
	for i := range ops {
		ops[i] = algo.Op{Kind: [...]algo.OpKind{algo.OpPeek, algo.OpLease}[i%2], Key: []byte(fmt.Sprintf("bench-%d", i)),
			Params: algo.Params{Kind: algo.TokenBucket, Limit: 1_000_000_000, Period: time.Second}, N: 1}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := rs.Do(ctx, ops); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(len(ops)), "µs/op-in-batch")
}

// TestDoTake: a batch takes as Store.Take does, and carries every op
// kind: an OpTakeLease (whose reply has the units leased too), OpGrant
// and OpReset, with the outcomes algo.Apply gives.
func TestDoTake(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Hour}
	key := []byte("take")
	ops := []algo.Op{
		{Kind: algo.OpTake, Key: key, Params: p, N: 3},
		{Kind: algo.OpTake, Key: key, Params: p, N: 8},
		{Kind: algo.OpTakeLease, Key: key, Params: p, N: 2, Costs: []int64{1, 1}},
		{Kind: algo.OpGrant, Key: key, Params: p, N: 4},
		{Kind: algo.OpTakeLease, Key: key, Params: p, N: 0, Costs: []int64{4, 5}},
	}
	require.NoError(t, rs.Do(context.Background(), ops))
	for i := range ops {
		require.NoError(t, ops[i].Err, i)
	}
	assert.True(t, ops[0].Result.Allowed)
	assert.Equal(t, int64(7), ops[0].Result.Remaining)
	assert.False(t, ops[1].Result.Allowed, "8 of 7 left")
	assert.Equal(t, 2, ops[2].Admitted)
	assert.Equal(t, int64(2), ops[2].Granted)
	assert.True(t, ops[2].Result.Allowed)
	assert.Equal(t, int64(3), ops[2].Result.Remaining)
	assert.Equal(t, int64(6), ops[3].Result.Remaining, "7 left after the grant, less the peek's unit")
	assert.Equal(t, 1, ops[4].Admitted, "4 of 7, then 5 of 3")
	assert.Zero(t, ops[4].Granted)
	assert.False(t, ops[4].Result.Allowed)
	r, err := rs.Take(context.Background(), key, p, 1, time.Now(), true)
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Remaining, "3 left")

	ops = []algo.Op{
		{Kind: algo.OpReset, Key: key, Params: p},
		{Kind: algo.OpTakeLease, Key: key, Params: p, N: 1},
		{Kind: algo.OpRefund, Key: key, Params: p, N: 0, TakenAt: 1},
	}
	require.NoError(t, rs.Do(context.Background(), ops))
	require.NoError(t, ops[0].Err)
	assert.Equal(t, int64(9), ops[0].Result.Remaining, "fresh")
	require.ErrorContains(t, ops[1].Err, "takelease of 0 costs")
	require.ErrorContains(t, ops[2].Err, "refund of 0 units")
	r, err = rs.Take(context.Background(), key, p, 10, time.Now(), true)
	require.NoError(t, err)
	assert.True(t, r.Allowed, "a fresh key admits its whole limit")
}

// TestDoOnce: an op with a Once id is applied once per key, through any
// Store on the Redis (two here, as two daemons): the second (with the
// same mark or another), and one after the scripts were flushed, run
// nothing and say so; another id, or another key, is applied. On Cluster the record shares its counter's
// slot.
func TestDoOnce(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprintf("cluster=%v", cluster), func(t *testing.T) {
			var stores [2]*redisx.Store
			var flush func()
			if cluster {
				c := redistest.StartCluster(t)
				for i := range stores {
					stores[i] = redisx.NewStore(newClient(t, redisx.Options{Addrs: c.Addrs()[i : i+1], Mode: redisx.Cluster}))
				}
				flush = func() {
					for _, n := range c.Nodes() {
						_, err := redistest.Do(n.Addr, "SCRIPT", "FLUSH")
						require.NoError(t, err)
					}
				}
			} else {
				srv := redistest.Standalone(t)
				for i := range stores {
					stores[i] = redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
				}
				flush = func() {
					_, err := redistest.Do(srv.Addr, "SCRIPT", "FLUSH")
					require.NoError(t, err)
				}
			}
			ctx := context.Background()
			for _, k := range kinds {
				if k == algo.Concurrency {
					continue // its slots are released, not settled
				}
				p := algo.Params{Kind: k, Limit: 100, Period: time.Hour}
				do := func(s *redisx.Store, key string, once uint64, mark int64) algo.Op {
					t.Helper()
					ops := []algo.Op{{Kind: algo.OpCharge, Key: []byte(key), Params: p, N: 7, Once: once, OnceMark: mark, OnceFor: time.Minute.Microseconds()}}
					require.NoError(t, s.Do(ctx, ops))
					return ops[0]
				}
				key := "once-" + k.String()
				o := do(stores[0], key, 42, 7)
				require.NoError(t, o.Err, k)
				assert.Equal(t, int64(92), o.Result.Remaining, "%s: charged 7 (a peek of 1 after it)", k)
				o = do(stores[1], key, 42, 7)
				assert.ErrorIs(t, o.Err, algo.ErrApplied, k)
				o = do(stores[1], key, 42, 8)
				assert.ErrorIs(t, o.Err, algo.ErrOnceConflict, "%s: another mark", k)
				flush()
				o = do(stores[0], key, 42, 7)
				assert.ErrorIs(t, o.Err, algo.ErrApplied, "%s: after the scripts were lost", k)
				o = do(stores[1], key, 43, 8)
				require.NoError(t, o.Err, k)
				assert.Equal(t, int64(85), o.Result.Remaining, "%s: the first was charged once, this one too", k)
				o = do(stores[1], key+"-other", 42, 7)
				require.NoError(t, o.Err, k)
				assert.Equal(t, int64(92), o.Result.Remaining, "%s: another key's record is its own", k)
			}
		})
	}
}

// TestDoOnceFailedNotRecorded: an op with a Once id that fails (here its
// key holds another type) is not recorded: sent again once the key is
// right, it is applied.
func TestDoOnceFailedNotRecorded(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, Period: time.Hour}
	rkey := string(redisx.AppendKey(nil, "t:", []byte("broken"), p.Kind))
	_, err := redistest.Do(srv.Addr, "SET", rkey, "not a hash")
	require.NoError(t, err)
	charge := func() algo.Op {
		t.Helper()
		ops := []algo.Op{{Kind: algo.OpCharge, Key: []byte("broken"), Params: p, N: 7, Once: 9, OnceMark: 7, OnceFor: time.Minute.Microseconds()}}
		require.NoError(t, rs.Do(ctx, ops))
		return ops[0]
	}
	o := charge()
	require.Error(t, o.Err)
	assert.NotErrorIs(t, o.Err, algo.ErrApplied)
	_, err = redistest.Do(srv.Addr, "DEL", rkey)
	require.NoError(t, err)
	o = charge()
	require.NoError(t, o.Err)
	assert.Equal(t, int64(92), o.Result.Remaining, "charged 7 (a peek of 1 after it)")
	o = charge()
	assert.ErrorIs(t, o.Err, algo.ErrApplied)
}
