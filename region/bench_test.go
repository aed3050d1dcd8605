package region

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redistest"
)

// BenchmarkTake compares a take on the embedded store with the same take
// through the region wrapper (a key with a live share): the wrapper's
// cost on the hot path: the share lookup and the demand count (the
// bucket is soon empty: most takes are refusals, as under a hammer).
// store=strict is the same take of a global_strict rule's key with a
// live share: one more share lookup, no round trip.
func BenchmarkTake(b *testing.B) {
	never := func() (rueidis.Client, error) { return nil, errors.New("not started") }
	r, err := New(Options{Region: "eu", Regions: three, ID: "b", DialLocal: never, DialGlobal: never})
	if err != nil {
		b.Fatal(err)
	}
	inner := memstore.New(memstore.Options{})
	w := r.Wrap(inner, tb.Limit, 0)
	now := time.Now()
	m := w.metaOf(&tb)
	if err := r.table.Install(map[string]string{m.field("k"): formatShare(tb.Limit, now.Add(time.Hour), 0, 0)}); err != nil {
		b.Fatal(err)
	}
	key := []byte("k")
	for _, bc := range []struct {
		name string
		s    policy.Store
	}{{"store=inner", inner}, {"store=wrapped", w}, {"store=strict", r.WrapStrict(inner, tb.Limit)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bc.s.Take(context.Background(), key, tb, 1, now, false)
			}
		})
	}
}

// BenchmarkLoad is one daemon's load of the region's shares hash from a
// real redis-server (HGETALL and Install), by the number of busy global
// keys: the per-interval cost that grows with them.
func BenchmarkLoad(b *testing.B) {
	c := client(b, redistest.Standalone(b).Addr)
	r := newRegion(b, "eu", "a", c, c, time.Minute)
	ctx := context.Background()
	m := meta{limit: 1000, periodMs: 1000, fallback: 333}
	exp := time.Now().Add(time.Hour)
	for _, n := range []int{100, 10000} {
		cmds := make(rueidis.Commands, 0, n)
		for i := range n {
			f := m.field("api_key=" + strconv.Itoa(i))
			cmds = append(cmds, c.B().Hset().Key(SharesKey).FieldValue().FieldValue(f, formatShare(300, exp, 250, 1)).Build())
		}
		for _, res := range c.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				b.Fatal(err)
			}
		}
		b.Run("keys="+strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := r.load(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
