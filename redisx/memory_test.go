package redisx_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// keyPrefix is the prefix of rld's configuration (config.DefaultKeyPrefix).
const keyPrefix = "rld:"

// TestMemoryPerKey logs what one counter costs in Redis for each
// algorithm, next to the seeds' napkin figure of 56 bytes for a token
// bucket: MEMORY USAGE of one key (key, value and Redis's per-key
// overhead, not its hash tables), and the growth of used_memory per key
// over many keys, which counts the tables and the expiry too. The counter
// key is a realistic one: rule "per-key", one 24-byte api_key.
func TestMemoryPerKey(t *testing.T) {
	srv := redistest.Standalone(t)
	c := newClient(t, redisx.Options{Addrs: []string{srv.Addr}, KeyPrefix: keyPrefix})
	rs := redisx.NewStore(c)
	ctx := context.Background()
	counterKey := func(i int) []byte {
		v := fmt.Sprintf("sk_live_%016d", i)
		return append([]byte("per-key\x00"+string(rune(len(v)))), v...)
	}
	usage := func(rkey string) int {
		t.Helper()
		s, err := redistest.Do(srv.Addr, "MEMORY", "USAGE", rkey, "SAMPLES", "0")
		require.NoError(t, err)
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "MEMORY USAGE replied %q", s)
		return n
	}
	usedMemory := func() int {
		t.Helper()
		info, err := redistest.Do(srv.Addr, "INFO", "memory")
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, err := strconv.Atoi(v)
				require.NoError(t, err)
				return n
			}
		}
		t.Fatal("no used_memory in INFO memory")
		return 0
	}

	const many = 2000
	var b strings.Builder
	fmt.Fprintf(&b, "Redis memory per counter key (key %q + {counter key of %d bytes} + suffix), napkin figure 56 B:\n",
		keyPrefix, len(counterKey(0)))
	fmt.Fprintf(&b, "%-28s %14s %22s\n", "algorithm", "MEMORY USAGE", "used_memory/key ("+strconv.Itoa(many)+")")
	for _, k := range kinds {
		p := algo.Params{Kind: k, Limit: 100, Period: time.Minute}
		_, err := rs.Take(ctx, counterKey(0), p, 1, time.Now(), false)
		require.NoError(t, err)
		one := usage(string(redisx.AppendKey(nil, keyPrefix, counterKey(0), k)))

		_, err = redistest.Do(srv.Addr, "FLUSHALL")
		require.NoError(t, err)
		before := usedMemory()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < many; i += 8 {
					if _, err := rs.Take(ctx, counterKey(i), p, 1, time.Now(), false); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		require.NoError(t, <-errs)
		perKey := float64(usedMemory()-before) / many
		fmt.Fprintf(&b, "%-28s %12d B %20.0f B\n", k.String()+" (1 admission)", one, perKey)
	}
	// A sliding log holds one entry per admission time.
	for _, limit := range []int64{5, 100} {
		p := algo.Params{Kind: algo.SlidingLog, Limit: limit, Period: time.Minute}
		key := counterKey(int(limit))
		for range limit {
			_, err := rs.Take(ctx, key, p, 1, time.Now(), false)
			require.NoError(t, err)
		}
		one := usage(string(redisx.AppendKey(nil, keyPrefix, key, algo.SlidingLog)))
		fmt.Fprintf(&b, "%-28s %12d B\n", fmt.Sprintf("sliding_log (%d admissions)", limit), one)
	}
	t.Log(b.String())
}
