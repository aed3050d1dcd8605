package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rld/rld/redistest"
)

// clusterBenchFlags is the load of BenchmarkCluster when RLD_BENCH_FLAGS
// does not name one: the long tail of docs/performance.md, measured
// once the warm leases are taken.
const clusterBenchFlags = "-mode closed -connections 4 -depth 16 -targets echo,rld -store redis -rule-mode cached,strict " +
	"-dist zipf -zipf 1.1 -keys 100000 -warmup 20s -duration 5s"

// BenchmarkCluster runs rld-bench against a daemon on a Redis Cluster of
// three primaries (and a replica each) that it starts with redistest,
// and prints rld-bench's tables, each primary's share of the script
// calls among them; then, for comparison in the same run, the same load
// against a daemon on one Redis (a redis-server rld-bench spawns). The
// daemon is bin/rld (build it first), or $RLD_BIN; the load is
// $RLD_BENCH_FLAGS, else clusterBenchFlags:
//
//	make build && go test -run '^$' -bench Cluster -benchtime 1x ./bench
func BenchmarkCluster(b *testing.B) {
	bin := os.Getenv("RLD_BIN")
	if bin == "" {
		bin = filepath.Join("..", "bin", "rld")
	}
	if _, err := os.Stat(bin); err != nil {
		b.Skipf("no daemon binary (make build, or set RLD_BIN): %v", err)
	}
	flags := os.Getenv("RLD_BENCH_FLAGS")
	if flags == "" {
		flags = clusterBenchFlags
	}
	c := redistest.StartCluster(b)
	var primaries []string
	for _, s := range c.Primaries() {
		primaries = append(primaries, s.Addr)
	}
	cluster := append(strings.Fields(flags), "-spawn", "-rld", bin, "-redis-cluster", strings.Join(primaries, ","))
	one := append(strings.Fields(flags), "-spawn", "-rld", bin)
	for b.Loop() {
		for _, args := range [][]string{cluster, one} {
			if len(args) == len(one) {
				fmt.Println("\nThe same load on one Redis:")
			}
			if code := run(args, os.Stdout, os.Stderr); code != 0 {
				b.Fatalf("rld-bench %s: exit %d", strings.Join(args, " "), code)
			}
		}
	}
}
