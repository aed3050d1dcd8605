package redisx_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/lua"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// BenchmarkOneInFlight measures a token-bucket take at one call in
// flight, the case of a strict check on an idle daemon, three ways: the
// script called with rueidis through its pipeline (AlwaysPipelining, as
// rld's pipelined connections), with rueidis in its synchronous mode (a
// sequential caller's floor: the calling goroutine writes and reads),
// and through redisx.Store.Take (the direct connection). Besides ns/op
// it reports the process's CPU time per call (getrusage), which is what
// the direct connection saves:
//
//	go test -run '^$' -bench OneInFlight -benchtime 20000x -count 5 ./redisx
func BenchmarkOneInFlight(b *testing.B) {
	srv := redistest.Standalone(b)
	src, _ := lua.Source("token_bucket")
	script := rueidis.NewLuaScript(src)
	ctx := context.Background()
	args := []string{"take", "1000000000", "1000000", "0", "0", "1"}
	bare := func(pipelined bool) func(b *testing.B) {
		return func(b *testing.B) {
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, ForceSingleClient: true,
				DisableCache: true, DisableRetry: true, AlwaysPipelining: pipelined})
			if err != nil {
				b.Fatal(err)
			}
			defer rc.Close()
			keys := []string{"bare:{k}:tb"}
			cpuPerOp(b, func() error {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				defer cancel()
				return script.Exec(cctx, rc, keys, args).Error()
			})
		}
	}
	b.Run("rueidis-pipelined", bare(true))
	b.Run("rueidis-sync", bare(false))
	b.Run("store", func(b *testing.B) {
		rs := benchStore(b, srv.Addr)
		p := algo.Params{Kind: algo.TokenBucket, Limit: 1e9, Period: time.Second}
		key := []byte("k")
		cpuPerOp(b, func() error {
			_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
			return err
		})
	})
}

// BenchmarkOneInFlightMiss is BenchmarkOneInFlight's store case for the
// call a hot-key cache makes on a miss: a Do of one takelease op with
// lease accounting (which goes over the direct connection as well):
//
//	go test -run '^$' -bench OneInFlightMiss -benchtime 20000x -count 5 ./redisx
func BenchmarkOneInFlightMiss(b *testing.B) {
	srv := redistest.Standalone(b)
	ctx := context.Background()
	rs := benchStore(b, srv.Addr)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1e9, Period: time.Second}
	ops := make([]algo.Op, 1)
	cpuPerOp(b, func() error {
		ops[0] = algo.Op{
			Kind: algo.OpTakeLease, Key: []byte("k"), Params: p, N: 1, Costs: []int64{1},
			Holder: "bench", LeaseLife: time.Second,
		}
		if err := rs.Do(ctx, ops); err != nil {
			return err
		}
		return ops[0].Err
	})
}

// benchStore returns a Store on a Client of the Redis at addr, closed
// when b ends.
func benchStore(b *testing.B, addr string) *redisx.Store {
	c, err := redisx.New(context.Background(), redisx.Options{Addrs: []string{addr}, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	return redisx.NewStore(c)
}

// cpuPerOp runs call b.N times, after a warm-up, and reports the
// process's user + system time per call as cpu-µs/op.
func cpuPerOp(b *testing.B, call func() error) {
	b.Helper()
	for range 200 {
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	before := rusage(b)
	b.ResetTimer()
	for range b.N {
		if err := call(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rusage(b)-before)/1e3/float64(b.N), "cpu-µs/op")
}

// rusage returns this process's user + system time.
func rusage(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCluster measures calls on a 3+3 Cluster: a take at one call
// in flight, and a Do of 96 takes over keys of every primary (each
// primary's share one call):
//
//	go test -run '^$' -bench Cluster -benchtime 5000x -count 5 ./redisx
func BenchmarkCluster(b *testing.B) {
	cl := redistest.StartCluster(b)
	c, err := redisx.New(context.Background(), redisx.Options{Addrs: cl.Addrs()[:1], Mode: redisx.Cluster, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	rs := redisx.NewStore(c)
	ctx := context.Background()
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1e9, Period: time.Second}
	b.Run("take", func(b *testing.B) {
		key := []byte("k")
		cpuPerOp(b, func() error {
			_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
			return err
		})
	})
	b.Run("do-96", func(b *testing.B) {
		ops := make([]algo.Op, 96)
		keys := make([][]byte, len(ops))
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "k%d", i)
		}
		cpuPerOp(b, func() error {
			for i := range ops {
				ops[i] = algo.Op{Kind: algo.OpTake, Key: keys[i], Params: p, N: 1}
			}
			if err := rs.Do(ctx, ops); err != nil {
				return err
			}
			for i := range ops {
				if ops[i].Err != nil {
					return ops[i].Err
				}
			}
			return nil
		})
	})
}
