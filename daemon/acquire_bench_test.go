package daemon_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
)

// BenchmarkAcquireReleaseRedis measures acquire+release pairs/s through
// the socket of a daemon on one Redis, with a concurrency rule (always
// strict: every acquire and release is decided in Redis), the goroutines
// on one hot key or spread over benchKeys keys. Besides pairs/s it
// reports the script calls Redis ran per pair (INFO commandstats): the
// acquires of one key are coalesced, its releases are one call each. Run
// it with
//
//	go test -run '^$' -bench BenchmarkAcquireReleaseRedis -benchtime 3s ./daemon
func BenchmarkAcquireReleaseRedis(b *testing.B) {
	srv := redistest.Standalone(b)
	s, err := daemontest.Start(fmt.Sprintf(`[store]
redis = [%q]
timeout = "1s" # a loaded machine must not send acquires to the fail-open fallback

[[rule]]
name = "slots"
by = ["api_key"]
algorithm = "concurrency"
limit = 1000000
timeout = "1m"
`, srv.Addr))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	evalsha := func() int64 {
		info, err := redistest.Do(srv.Addr, "INFO", "commandstats")
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
				n, _ := strconv.ParseInt(v[:strings.IndexByte(v, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	for _, keys := range []int{1, benchKeys} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(benchParallelism)
			calls0 := evalsha()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				g := int(next.Add(1))
				c := client.New(s.Socket)
				defer c.Close()
				ctx := context.Background()
				for i := g; pb.Next(); i += 7 {
					descs := []client.Descriptor{{Name: "api_key", Value: "k" + strconv.Itoa(i%keys)}}
					r, err := c.Acquire(ctx, descs, 1)
					if err != nil || !r.Allowed() {
						b.Errorf("acquire: %+v, %v", r, err)
						return
					}
					if _, err := c.Release(ctx, r.Lease); err != nil {
						b.Errorf("release: %v", err)
						return
					}
				}
			})
			elapsed := time.Since(start)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
			b.ReportMetric(float64(evalsha()-calls0)/float64(b.N), "scripts/pair")
		})
	}
}
