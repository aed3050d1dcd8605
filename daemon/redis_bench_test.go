package daemon_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/lua"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
	"github.com/rld/rld/wire"
)

// benchKeys is how many counter keys the Redis benchmarks spread over.
const benchKeys = 1024

// benchParallelism × GOMAXPROCS goroutines issue the calls.
const benchParallelism = 16

// BenchmarkRedisStrict measures strict checks/s against one Redis, three
// ways in one run, all with the same token bucket script, the same keys
// and the same number of goroutines:
//
//   - bare: rueidis Lua.Exec (EVALSHA) from Go, nothing else — the floor;
//   - store: redisx.Store.Take, what the daemon calls;
//   - daemon: checks through rld's socket, one client connection per
//     goroutine, a strict rule decided in Redis on every check.
//
// It logs each one's checks/s and their ratio to bare. Run it with
//
//	go test -run '^$' -bench BenchmarkRedisStrict -benchtime 3s ./daemon
func BenchmarkRedisStrict(b *testing.B) {
	srv := redistest.Standalone(b)
	src, _ := lua.Source("token_bucket")
	script := rueidis.NewLuaScript(src)
	const limit, period = 1_000_000_000, time.Second
	rates := map[string]float64{}
	// measure runs worker(g) in each goroutine g; the func it returns
	// makes call number i.
	measure := func(name string, worker func(g int) (call func(i int) error, done func())) {
		b.Run(name, func(b *testing.B) {
			var next atomic.Int64
			b.SetParallelism(benchParallelism)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				g := int(next.Add(1))
				call, done := worker(g)
				defer done()
				for i := g; pb.Next(); i += 7 {
					if err := call(i); err != nil {
						b.Error(err)
						return
					}
				}
			})
			rate := float64(b.N) / time.Since(start).Seconds()
			b.ReportMetric(rate, "checks/s")
			rates[name] = rate
		})
	}

	rc, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{srv.Addr}, ForceSingleClient: true, DisableCache: true, DisableRetry: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	ctx := context.Background()
	args := []string{"take", strconv.Itoa(limit), strconv.FormatInt(period.Microseconds(), 10), "0", "0", "1"}
	nothing := func() {}
	measure("bare", func(int) (func(int) error, func()) {
		return func(i int) error {
			key := "bare:{" + strconv.Itoa(i%benchKeys) + "}"
			v, err := script.Exec(ctx, rc, []string{key}, args).AsIntSlice()
			if err == nil && v[0] != 1 {
				err = fmt.Errorf("denied: %v", v)
			}
			return err
		}, nothing
	})

	c, err := redisx.New(ctx, redisx.Options{Addrs: []string{srv.Addr}, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	rs := redisx.NewStore(c)
	p := algo.Params{Kind: algo.TokenBucket, Limit: limit, Period: period}
	measure("store", func(int) (func(int) error, func()) {
		return func(i int) error {
			r, err := rs.Take(ctx, []byte(strconv.Itoa(i%benchKeys)), p, 1, time.Now(), false)
			if err == nil && !r.Allowed {
				err = fmt.Errorf("denied: %+v", r)
			}
			return err
		}, nothing
	})

	d, err := daemontest.Start(fmt.Sprintf(`
[server]
max_connections = 10000
[store]
redis = [%q]
timeout = "1s"
[[rule]]
name = "strict"
by = ["api_key"]
limit = %d
period = %q
mode = "strict"
`, srv.Addr, limit, period))
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	measure("daemon", func(int) (func(int) error, func()) {
		cl := client.New(d.Socket) // one connection per goroutine
		descs := []client.Descriptor{{Name: "api_key"}}
		return func(i int) error {
			descs[0].Value = strconv.Itoa(i % benchKeys)
			r, err := cl.Check(ctx, descs, 1)
			if err == nil && r.Status != wire.StatusAllowed {
				err = fmt.Errorf("not allowed: %+v", r)
			}
			return err
		}, func() { cl.Close() }
	})
	b.Logf("strict checks/s: bare EVALSHA %.0f, store %.0f (%.2f of bare), daemon %.0f (%.2f of bare)",
		rates["bare"], rates["store"], rates["store"]/rates["bare"], rates["daemon"], rates["daemon"]/rates["bare"])
}

// TestStrictCheckIsOneCall: a strict check costs Redis one script call
// (EVALSHA; EVAL only after Redis lost the script), nothing else: one
// round trip.
func TestStrictCheckIsOneCall(t *testing.T) {
	srv := redistest.Standalone(t)
	d := start(t, fleetConfig(fmt.Sprintf("redis = [%q]", srv.Addr), 10_000, "strict"))
	c := client.New(d.Socket)
	defer c.Close()
	check := func() {
		t.Helper()
		r, err := c.Check(context.Background(), []client.Descriptor{{Name: "api_key", Value: "k"}, {Name: "alg", Value: "sliding_counter"}}, 1)
		if err != nil || r.Status != wire.StatusAllowed {
			t.Fatalf("check: %v %+v", err, r)
		}
	}
	check() // the script is loaded (EVALSHA → NOSCRIPT → EVAL) once
	// So is the heartbeat's, at the daemon's first heartbeat: wait for it.
	for deadline := time.Now().Add(5 * time.Second); ; {
		n, err := redistest.Do(srv.Addr, "ZCARD", "rld:daemons")
		if err == nil && n != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat in 5s: %v %s", err, n)
		}
		time.Sleep(10 * time.Millisecond) // polling
	}
	_, err := redistest.Do(srv.Addr, "CONFIG", "RESETSTAT")
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	for range n {
		check()
	}
	calls := commandCalls(t, srv.Addr)
	t.Logf("redis commands for %d strict checks: %v", n, calls)
	// The daemon's heartbeat (one script call a second, which ZADDs once)
	// may fall in the measurement: its calls are not the checks'.
	beats := calls["zadd"]
	// So may the poll of the overrides' version (one script call a
	// second, which HGETs once) and a load of them (HGETALL), after
	// the subscription to their announcements.
	polls := calls["hget"] + calls["hgetall"]
	if calls["evalsha"]+calls["eval"] != n+beats+polls {
		t.Errorf("%d EVALSHA and %d EVAL for %d checks, %d heartbeats and %d polls of the overrides", calls["evalsha"], calls["eval"], n, beats, polls)
	}
	// The others are the scripts' own (commandstats counts them too):
	// the sliding counter reads Redis TIME, HMGET, HSET and PEXPIRE, the
	// heartbeat updates its sorted set; and the set-up of a connection
	// rueidis opens lazily.
	for name, k := range calls {
		switch {
		case name == "evalsha", name == "time", name == "hmget", name == "hset", name == "pexpire",
			name == "config|resetstat", name == "ping", name == "hello", strings.HasPrefix(name, "client|"):
		case beats > 0 && (name == "eval" || name == "zadd" || name == "zremrangebyscore" || name == "zcard" || name == "pttl"):
		case name == "subscribe" || (polls > 0 && (name == "eval" || name == "hget" || name == "hgetall")):
		case k == 1 && (name == "discard" || name == "unsubscribe" || name == "punsubscribe" || name == "sunsubscribe"):
			// The scripts' preload runs on a dedicated connection, which
			// rueidis resets once as it goes back to its pool.
		default:
			t.Errorf("%d calls of %s", k, name)
		}
	}
}
