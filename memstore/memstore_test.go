package memstore

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
)

// t0 is a fake clock's start, aligned to the hour.
var t0 = time.UnixMicro(1_699_999_200_000_000)

var ctx = context.Background()

var kinds = []algo.Kind{algo.TokenBucket, algo.GCRA, algo.FixedWindow, algo.SlidingCounter, algo.SlidingLog}

// take calls s.Take and fails the test on an error.
func take(t testing.TB, s *Store, key string, p algo.Params, cost int64, now time.Time, peek bool) algo.Result {
	t.Helper()
	r, err := s.Take(ctx, []byte(key), p, cost, now, peek)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkInvariants checks that every shard's map and LRU list hold the
// same entries, within the shard's bound, and that Len agrees.
func checkInvariants(t *testing.T, s *Store) {
	t.Helper()
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := 0
		for e := sh.lru.root.next; e != &sh.lru.root; e = e.next {
			if e.next.prev != e {
				t.Errorf("shard %d: broken links at %q", i, e.key)
			}
			if sh.get([]byte(e.key), e.hash) != e {
				t.Errorf("shard %d: %q in the list, not in the map", i, e.key)
			}
			n++
		}
		chained := 0
		for _, e := range sh.m {
			for ; e != nil; e = e.same {
				chained++
			}
		}
		if n != chained || n != sh.n || n > s.perShard {
			t.Errorf("shard %d: %d in the list, %d in the map, count %d, bound %d", i, n, chained, sh.n, s.perShard)
		}
		total += n
		sh.mu.Unlock()
	}
	if total != s.Len() {
		t.Errorf("Len %d, shards hold %d", s.Len(), total)
	}
}

// has reports whether s holds key.
func has(s *Store, key string) bool {
	sh, h := s.shard([]byte(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.get([]byte(key), h) != nil
}

func TestNewOptions(t *testing.T) {
	tests := []struct {
		o                Options
		shards, perShard int
	}{
		{Options{}, DefaultShards, 2 * (DefaultMaxKeys/DefaultShards + 1)},
		{Options{MaxKeys: 1000, Shards: 100}, 8, 250},
		{Options{MaxKeys: 10, Shards: 1}, 1, 20},
		{Options{MaxKeys: 3}, 1, 6},
		{Options{MaxKeys: -1, Shards: -1}, DefaultShards, 2 * (DefaultMaxKeys/DefaultShards + 1)},
	}
	for _, tt := range tests {
		s := New(tt.o)
		if len(s.shards) != tt.shards || s.perShard != tt.perShard {
			t.Errorf("New(%+v): %d shards of %d, want %d of %d", tt.o, len(s.shards), s.perShard, tt.shards, tt.perShard)
		}
	}
}

func TestTakeExactUnderConcurrency(t *testing.T) {
	const goroutines, takes, limit = 16, 200, 1000
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			s := New(Options{})
			p := algo.Params{Kind: kind, Limit: limit, Period: time.Minute}
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for range goroutines {
				wg.Go(func() {
					for range takes {
						r, err := s.Take(ctx, []byte("one-key"), p, 1, t0, false)
						if err != nil {
							t.Error(err)
							return
						}
						if r.Allowed {
							allowed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if got := allowed.Load(); got != limit {
				t.Errorf("%d allowed, want exactly %d", got, limit)
			}
			checkInvariants(t, s)
		})
	}
}

func TestConcurrentEviction(t *testing.T) {
	s := New(Options{MaxKeys: 100, Shards: 8})
	p := algo.Params{Kind: algo.SlidingLog, Limit: 5, Period: time.Minute}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			key := make([]byte, 0, 16)
			for i := range 2000 {
				key = strconv.AppendInt(key[:0], int64((g*7919+i*31)%500), 10)
				now := t0.Add(time.Duration(i) * time.Millisecond)
				if _, err := s.Take(ctx, key, p, 1, now, i%5 == 0); err != nil {
					t.Error(err)
				}
				if i%3 == 0 {
					if err := s.Refund(ctx, key, p, 1, now, now); err != nil {
						t.Error(err)
					}
				}
				if i%500 == 0 {
					s.Sweep(now)
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, s)
	if s.Len() > 8*s.perShard {
		t.Errorf("Len %d above the bound %d", s.Len(), 8*s.perShard)
	}
}

func TestPeek(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.FixedWindow, Limit: 2, Period: time.Second}
	if r := take(t, s, "k", p, 1, t0, true); !r.Allowed || r.Remaining != 1 {
		t.Errorf("peek on a missing key: %+v", r)
	}
	if s.Len() != 0 || has(s, "k") {
		t.Fatal("a peek on a missing key created it")
	}
	take(t, s, "k", p, 1, t0, false)
	for range 3 {
		if r := take(t, s, "k", p, 1, t0, true); !r.Allowed || r.Remaining != 0 {
			t.Errorf("peek: %+v", r)
		}
	}
	if r := take(t, s, "k", p, 1, t0, false); !r.Allowed || r.Remaining != 0 {
		t.Errorf("take after peeks: %+v", r)
	}
	if r := take(t, s, "k", p, 1, t0, false); r.Allowed {
		t.Errorf("third take: %+v", r)
	}
}

func TestDeniedMissingKeyCreatesNothing(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 2, Period: time.Second}
	if r := take(t, s, "k", p, 3, t0, false); r.Allowed || r.RetryAfter != algo.Never {
		t.Errorf("cost above capacity: %+v", r)
	}
	if s.Len() != 0 {
		t.Error("a denied take created a key")
	}
}

func TestCostBelowOne(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.FixedWindow, Limit: 2, Period: time.Second}
	for _, cost := range []int64{0, -3} {
		if r := take(t, s, "k", p, cost, t0, false); !r.Allowed {
			t.Errorf("cost %d: %+v", cost, r)
		}
	}
	if r := take(t, s, "k", p, 0, t0, false); r.Allowed {
		t.Errorf("third unit: %+v", r)
	}
	if err := s.Refund(ctx, []byte("k"), p, 0, t0, t0); err != nil {
		t.Fatal(err)
	}
	if r := take(t, s, "k", p, 1, t0, true); !r.Allowed {
		t.Errorf("after a refund of cost 0 (1): %+v", r)
	}
}

func TestKindChangeStartsFresh(t *testing.T) {
	s := New(Options{})
	fixed := algo.Params{Kind: algo.FixedWindow, Limit: 1, Period: time.Minute}
	gcra := algo.Params{Kind: algo.GCRA, Limit: 1, Period: time.Minute}
	take(t, s, "k", fixed, 1, t0, false)
	if r := take(t, s, "k", gcra, 1, t0, true); !r.Allowed {
		t.Errorf("peek under another algorithm: %+v", r)
	}
	if r := take(t, s, "k", fixed, 1, t0, false); r.Allowed {
		t.Errorf("a peek under another algorithm reset the state: %+v", r)
	}
	if r := take(t, s, "k", gcra, 1, t0, false); !r.Allowed {
		t.Errorf("take under another algorithm: %+v", r)
	}
	if r := take(t, s, "k", gcra, 1, t0, false); r.Allowed {
		t.Errorf("second GCRA take: %+v", r)
	}
	if s.Len() != 1 {
		t.Errorf("Len %d, want 1", s.Len())
	}
}

func TestRefund(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.String(), func(t *testing.T) {
			s := New(Options{})
			p := algo.Params{Kind: kind, Limit: 3, Period: time.Minute}
			take(t, s, "k", p, 2, t0, false)
			now := t0.Add(time.Second)
			if r := take(t, s, "k", p, 2, now, false); r.Allowed {
				t.Fatalf("over the limit: %+v", r)
			}
			if err := s.Refund(ctx, []byte("k"), p, 2, t0, now); err != nil {
				t.Fatal(err)
			}
			if r := take(t, s, "k", p, 3, now, false); !r.Allowed {
				t.Errorf("after the refund: %+v", r)
			}
		})
	}
	s := New(Options{})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 3, Period: time.Minute}
	if err := s.Refund(ctx, []byte("missing"), p, 1, t0, t0); err != nil || s.Len() != 0 {
		t.Errorf("refund of a missing key: %v, Len %d", err, s.Len())
	}
}

func TestInvalidParams(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 0, Period: time.Second}
	if _, err := s.Take(ctx, []byte("k"), p, 1, t0, false); err == nil {
		t.Error("Take accepted limit 0")
	}
	if err := s.Refund(ctx, []byte("k"), p, 1, t0, t0); err == nil {
		t.Error("Refund accepted limit 0")
	}
}

func TestEvictionAtMaxKeys(t *testing.T) {
	s := New(Options{MaxKeys: 64, Shards: 4})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Hour}
	before := evictions.Get()
	for i := range 1000 {
		take(t, s, fmt.Sprint("key-", i), p, 1, t0, false)
	}
	if s.Len() != 64 {
		t.Errorf("Len %d, want 64", s.Len())
	}
	if got := evictions.Get() - before; got != 1000-64 {
		t.Errorf("%d evictions, want %d", got, 1000-64)
	}
	checkInvariants(t, s)
}

func TestEvictsLeastRecentlyUsed(t *testing.T) {
	s := New(Options{MaxKeys: 3, Shards: 1})
	p := algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: time.Hour}
	for _, k := range []string{"a", "b", "c"} {
		take(t, s, k, p, 1, t0, false)
	}
	take(t, s, "a", p, 1, t0, true) // a peek is a use too
	take(t, s, "d", p, 1, t0, false)
	for k, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
		if has(s, k) != want {
			t.Errorf("holds %q: %v, want %v", k, !want, want)
		}
	}
	checkInvariants(t, s)
}

func TestFullShardDropsIdleFirst(t *testing.T) {
	s := New(Options{MaxKeys: 2, Shards: 1})
	busy := algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: time.Hour}
	brief := algo.Params{Kind: algo.GCRA, Limit: 10, Period: time.Second}
	take(t, s, "busy", busy, 1, t0, false) // least recently used
	take(t, s, "brief", brief, 1, t0, false)
	ev, sw := evictions.Get(), swept.Get()
	take(t, s, "new", busy, 1, t0.Add(time.Second), false)
	if !has(s, "busy") || has(s, "brief") || !has(s, "new") {
		t.Error("the full shard did not drop its idle key")
	}
	if evictions.Get() != ev || swept.Get() != sw+1 {
		t.Errorf("evictions +%d, swept +%d; want +0, +1", evictions.Get()-ev, swept.Get()-sw)
	}
}

func TestSweep(t *testing.T) {
	s := New(Options{Shards: 4})
	params := map[string]algo.Params{
		"bucket":  {Kind: algo.TokenBucket, Limit: 10, Period: time.Second},    // full 100ms on
		"gcra":    {Kind: algo.GCRA, Limit: 1, Period: time.Minute},            // idle 1m on
		"fixed":   {Kind: algo.FixedWindow, Limit: 10, Period: time.Second},    // window ends at 1s
		"counter": {Kind: algo.SlidingCounter, Limit: 10, Period: time.Second}, // estimate 0 at 2s
		"log":     {Kind: algo.SlidingLog, Limit: 10, Period: time.Hour},       // idle 1h on
	}
	for k, p := range params {
		take(t, s, k, p, 1, t0, false)
	}
	before := swept.Get()
	steps := []struct {
		at   time.Duration
		gone int
		left []string
	}{
		{0, 0, []string{"bucket", "gcra", "fixed", "counter", "log"}},
		{100*time.Millisecond - time.Microsecond, 0, []string{"bucket"}},
		{100 * time.Millisecond, 1, []string{"gcra", "fixed", "counter", "log"}},
		{time.Second, 1, []string{"gcra", "counter", "log"}},
		{2 * time.Second, 1, []string{"gcra", "log"}},
		{time.Minute, 1, []string{"log"}},
		{time.Hour, 1, nil},
	}
	for _, st := range steps {
		if got := s.Sweep(t0.Add(st.at)); got != st.gone {
			t.Errorf("Sweep at t0+%v deleted %d, want %d", st.at, got, st.gone)
		}
		for _, k := range st.left {
			if !has(s, k) {
				t.Errorf("Sweep at t0+%v deleted %q", st.at, k)
			}
		}
	}
	if s.Len() != 0 || swept.Get()-before != 5 {
		t.Errorf("Len %d, swept +%d; want 0, +5", s.Len(), swept.Get()-before)
	}
	checkInvariants(t, s)
}

func TestRun(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Second}
	take(t, s, "k", p, 1, time.Now().Add(-time.Hour), false)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		s.Run(ctx, time.Millisecond)
		close(done)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("Run did not sweep the idle key within 5s")
		}
		runtime.Gosched()
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context was done")
	}
}

func TestTakeHotAllocs(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Second}
	key := []byte("tenant:42:/v1/items")
	now := t0
	take(t, s, string(key), p, 1, now, false)
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		if _, err := s.Take(ctx, key, p, 1, now, false); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocs per Take of a held key, want 0", allocs)
	}
}

// BenchmarkTakeHot takes from one token bucket key, about 70% allowed.
func BenchmarkTakeHot(b *testing.B) {
	s := New(Options{})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Second}
	key := []byte("tenant:42:/v1/items")
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(700 * time.Microsecond)
		if _, err := s.Take(ctx, key, p, 1, now, false); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTakeParallel takes from 100,000 held keys at random, from
// GOMAXPROCS goroutines.
func BenchmarkTakeParallel(b *testing.B) {
	const n = 100_000
	s := New(Options{})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Second}
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "tenant:%d:/v1/items", i)
		take(b, s, string(keys[i]), p, 1, t0, false)
	}
	var seq atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := seq.Add(1) * 7919
		now := t0
		for pb.Next() {
			i = i*6364136223846793005 + 1442695040888963407
			now = now.Add(time.Microsecond)
			if _, err := s.Take(ctx, keys[(i>>33)%n], p, 1, now, false); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkBytesPerKey reports the heap held per token bucket key, with
// keys of 24 bytes.
func BenchmarkBytesPerKey(b *testing.B) {
	const n = 200_000
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Second}
	key := make([]byte, 0, 32)
	var perKey float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := New(Options{MaxKeys: n})
		for i := range n {
			key = fmt.Appendf(key[:0], "tenant:%08d:/v1/item", i)
			if _, err := s.Take(ctx, key, p, 1, t0, false); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perKey = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(perKey, "bytes/key")
}

// TestNoEvictionBelowMaxKeys: uneven hashing must not evict live keys
// while the store as a whole is below MaxKeys.
func TestNoEvictionBelowMaxKeys(t *testing.T) {
	for _, maxKeys := range []int{1000, 10000} {
		s := New(Options{MaxKeys: maxKeys})
		p := algo.Params{Kind: algo.FixedWindow, Limit: 10, Period: time.Hour}
		now := time.Unix(1_800_000_000, 0)
		live := maxKeys * 8 / 10
		for i := range live {
			if _, err := s.Take(context.Background(), []byte(fmt.Sprintf("key-%d", i)), p, 1, now, false); err != nil {
				t.Fatal(err)
			}
		}
		if s.Len() != live {
			t.Errorf("MaxKeys %d: holds %d of %d live keys", maxKeys, s.Len(), live)
		}
		for i := range live {
			r, _ := s.Take(context.Background(), []byte(fmt.Sprintf("key-%d", i)), p, 1, now, true)
			if r.Remaining != 8 { // 10 - 1 taken - 1 peeked: the key kept its state
				t.Fatalf("MaxKeys %d: key-%d lost its state (remaining %d)", maxKeys, i, r.Remaining)
			}
		}
	}
}

// TestHashCollisionChain forces three keys onto one hash, which the
// Store's seeded hash makes practically impossible, and checks that each
// keeps its own state and that removing any of them leaves the others
// reachable.
func TestHashCollisionChain(t *testing.T) {
	keys := []string{"a", "b", "c"}
	for _, gone := range keys {
		s := New(Options{MaxKeys: 1000, Shards: 1})
		sh := &s.shards[0]
		const h = 42
		sh.mu.Lock()
		for i, k := range keys {
			s.insert(sh, []byte(k), h, algo.FixedWindow, algo.State{A: int64(i + 1)}, 1<<62, 0)
		}
		sh.remove(sh.get([]byte(gone), h))
		s.keys.Add(-1) // as a caller of remove does
		liveKeys.Add(-1)
		for i, k := range keys {
			e := sh.get([]byte(k), h)
			switch {
			case k == gone && e != nil:
				t.Errorf("removed %q is still found", k)
			case k != gone && (e == nil || e.st.A != int64(i+1)):
				t.Errorf("after removing %q, %q finds %+v, want state A=%d", gone, k, e, i+1)
			}
		}
		if sh.n != 2 {
			t.Errorf("after removing %q the shard counts %d entries, want 2", gone, sh.n)
		}
		sh.mu.Unlock()
		checkInvariants(t, s) // it looks entries up by their own (forced) hash
	}
}

// TestEvictionWithinChain fills a one-shard store with keys that share a
// hash, so that the victim of the next insert is on the chain the new key
// joins: the victim goes, and every other key stays reachable.
func TestEvictionWithinChain(t *testing.T) {
	s := New(Options{MaxKeys: 3, Shards: 1})
	sh := &s.shards[0]
	const h = 7
	sh.mu.Lock()
	for i, k := range []string{"a", "b", "c", "d"} {
		// Not idle (idleAt in the far future): the least recently used
		// is evicted, which is "a" when "d" arrives.
		s.insert(sh, []byte(k), h, algo.FixedWindow, algo.State{A: int64(i + 1)}, 1<<62, 0)
	}
	for i, k := range []string{"a", "b", "c", "d"} {
		e := sh.get([]byte(k), h)
		switch {
		case k == "a" && e != nil:
			t.Errorf("the least recently used key %q was not evicted", k)
		case k != "a" && (e == nil || e.st.A != int64(i+1)):
			t.Errorf("%q finds %+v, want state A=%d", k, e, i+1)
		}
	}
	sh.mu.Unlock()
	checkInvariants(t, s)
}

// TestDoMatchesApply: Do runs every op kind as algo.Apply does on the
// key's state, on every algorithm; a reset drops the key, a grant or a
// refund of a key the store does not hold creates nothing, and a bad op
// changes nothing.
func TestDoMatchesApply(t *testing.T) {
	for _, k := range kinds {
		p := algo.Params{Kind: k, Limit: 10, Period: time.Minute, Burst: 12}
		s := New(Options{})
		key := []byte("k")
		var ref algo.State
		steps := []algo.Op{
			{Kind: algo.OpGrant, N: 3},
			{Kind: algo.OpTake, N: 4},
			{Kind: algo.OpPeek, N: 9},
			{Kind: algo.OpTakeLease, N: 2, Costs: []int64{1, 2}},
			{Kind: algo.OpLease, N: 20},
			{Kind: algo.OpGrant, N: 3},
			{Kind: algo.OpTake, N: 4},
			{Kind: algo.OpRefund, N: 1},
			{Kind: algo.OpReset},
			{Kind: algo.OpTake, N: 5},
		}
		for i, st := range steps {
			now := t0.Add(time.Duration(i) * time.Millisecond)
			st.Key, st.Params, st.TakenAt = key, p, now.Add(-time.Millisecond).UnixMicro()
			want := st
			algo.Apply(&want, &ref, now.UnixMicro())
			ops := []algo.Op{st}
			if err := s.Do(ctx, ops, now); err != nil {
				t.Fatal(err)
			}
			if ops[0].Err != nil || ops[0].Result != want.Result || ops[0].Granted != want.Granted || ops[0].Admitted != want.Admitted {
				t.Errorf("%v step %d %s: got %+v, want %+v", k, i, st.Kind, ops[0], want)
			}
			if i == 0 && s.Has(key) {
				t.Errorf("%v: a grant of a missing key created it", k)
			}
			if st.Kind == algo.OpReset && s.Has(key) {
				t.Errorf("%v: a reset kept the key", k)
			}
		}
		bad := []algo.Op{
			{Kind: algo.NumOpKinds, Key: key, Params: p},
			{Kind: algo.OpTake, Key: key, Params: algo.Params{Kind: k}},
			{Kind: algo.OpTakeLease, Key: key, Params: p, N: 1},
		}
		before := take(t, s, "k", p, 1, t0.Add(time.Second), true)
		if err := s.Do(ctx, bad, t0.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		for i := range bad {
			if bad[i].Err == nil {
				t.Errorf("%v: bad op %d: no error", k, i)
			}
		}
		if after := take(t, s, "k", p, 1, t0.Add(time.Second), true); after != before {
			t.Errorf("%v: bad ops changed the key: %+v → %+v", k, before, after)
		}
	}
}

// TestLogClockNeverStepsBack: callers' times interleave (each takes its
// now before it gets the lock); an admission at a time before the key's
// newest entry is made, and named, at that entry's time, so that its
// release (or refund) finds it.
func TestLogClockNeverStepsBack(t *testing.T) {
	for _, kind := range []algo.Kind{algo.Concurrency, algo.SlidingLog} {
		t.Run(kind.String(), func(t *testing.T) {
			s := New(Options{})
			ctx := context.Background()
			p := algo.Params{Kind: kind, Limit: 10, Period: time.Minute}
			t0 := time.Unix(1_700_000_000, 0)
			late, err := s.Take(ctx, []byte("k"), p, 1, t0.Add(5*time.Microsecond), false)
			require.NoError(t, err)
			early, err := s.Take(ctx, []byte("k"), p, 1, t0, false)
			require.NoError(t, err)
			require.True(t, late.Allowed && early.Allowed)
			assert.Equal(t, late.At, early.At, "admitted at the key's time, not before it")
			assert.Equal(t, int64(8), early.Remaining)
			op := algo.OpRefund
			if kind == algo.Concurrency {
				op = algo.OpRelease
			}
			ops := []algo.Op{{Kind: op, Key: []byte("k"), Params: p, N: 1, TakenAt: early.At}}
			require.NoError(t, s.Do(ctx, ops, t0.Add(time.Microsecond)))
			require.NoError(t, ops[0].Err)
			if kind == algo.Concurrency {
				assert.Equal(t, 1, ops[0].Admitted, "released")
			}
			r, err := s.Take(ctx, []byte("k"), p, 1, t0, true)
			require.NoError(t, err)
			assert.Equal(t, int64(8), r.Remaining, "one unit back: a peek of 1 leaves 8")
		})
	}
}

// TestSlotsOfOneMicrosecond: two slots acquired at one microsecond (as a
// coalesced pair would be) share a time; releasing the first twice frees
// it once, the second stays held, and the limit is never exceeded.
func TestSlotsOfOneMicrosecond(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.Concurrency, Limit: 3, Period: time.Minute}
	key := []byte("cc")
	a, err := s.TakeSlot(ctx, key, p, 0xa, t0)
	require.NoError(t, err)
	b, err := s.TakeSlot(ctx, key, p, 0xb, t0)
	require.NoError(t, err)
	require.True(t, a.Allowed && b.Allowed)
	require.Equal(t, a.At, b.At, "one microsecond")
	release := func(at int64, slot uint64) int {
		ops := []algo.Op{{Kind: algo.OpRelease, Key: key, Params: p, N: 1, TakenAt: at, Slot: slot}}
		require.NoError(t, s.Do(ctx, ops, t0.Add(time.Second)))
		require.NoError(t, ops[0].Err)
		return ops[0].Admitted
	}
	assert.Equal(t, 1, release(a.At, 0xa))
	assert.Equal(t, 0, release(a.At, 0xa), "A released twice")
	assert.Equal(t, 0, release(a.At, 0), "by time alone")
	held := 1 // B
	for id := uint64(0x10); id < 0x20; id++ {
		r, err := s.TakeSlot(ctx, key, p, id, t0.Add(2*time.Second))
		require.NoError(t, err)
		if r.Allowed {
			held++
		}
	}
	assert.Equal(t, 3, held, "B's slot stays held: 2 more fit, not 3")
	assert.Equal(t, 1, release(b.At, 0xb))
	_, err = s.TakeSlot(ctx, key, algo.Params{Kind: algo.SlidingLog, Limit: 3, Period: time.Minute}, 1, t0)
	assert.Error(t, err, "a slot of a sliding log")
	ops := []algo.Op{{Kind: algo.OpAcquire, Key: key, Params: p}}
	require.NoError(t, s.Do(ctx, ops, t0))
	assert.Error(t, ops[0].Err, "an acquire with no slots")
}

// TestTakeSlotHotAllocs: acquiring and releasing a slot of a held key
// does not allocate.
func TestTakeSlotHotAllocs(t *testing.T) {
	s := New(Options{})
	p := algo.Params{Kind: algo.Concurrency, Limit: 1000, Period: time.Second}
	key := []byte("cc")
	now := t0
	_, err := s.TakeSlot(ctx, key, p, 1, now)
	require.NoError(t, err)
	id := uint64(1)
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(time.Millisecond)
		id++
		if _, err := s.TakeSlot(ctx, key, p, id, now); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocs per TakeSlot of a held key, want 0", allocs)
	}
}
