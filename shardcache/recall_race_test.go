package shardcache_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// opsHookBackend is an algoBackend that runs after, when set, once a Sync
// call has been applied at the store and before its caller sees the
// answer: what happens while a call is out.
type opsHookBackend struct {
	*algoBackend
	after func(ops []algo.Op)
}

func (h *opsHookBackend) Sync(ctx context.Context, ops []algo.Op) error {
	err := h.algoBackend.Sync(ctx, ops)
	if h.after != nil {
		h.after(ops)
	}
	return err
}

// TestGrantAfterRecallGoesBack: another daemon's recall of a key comes
// while this daemon's call that leases units of it is out (a
// take-with-lease of a check, or the sync's top-up): the recall finds
// nothing to give back, and the grant then arrives. The grant goes back
// at once, rather than staying parked until the key goes idle while the
// recalling daemon waits for it in vain and refuses its check. Without
// the recall, the same grant is kept (the control).
func TestGrantAfterRecallGoesBack(t *testing.T) {
	for _, k := range cachedKinds {
		for _, path := range []string{"take", "sync"} {
			for _, recalled := range []bool{true, false} {
				name := k.String() + "/" + path
				if !recalled {
					name += "/no recall"
				}
				t.Run(name, func(t *testing.T) { grantAfterRecall(t, k, path, recalled) })
			}
		}
	}
}

// grantAfterRecall runs TestGrantAfterRecallGoesBack for kind k, the
// grant coming from path ("take": a check's take-with-lease; "sync":
// the sync's top-up), with the recall coming while it is out or not.
func grantAfterRecall(t *testing.T, k algo.Kind, path string, recalled bool) {
	h := &opsHookBackend{algoBackend: newAlgoBackend()}
	clk := h.clk
	// No Recall of its own: its leases are never warm, so that the
	// sync tops a hot key's lease up (see plan).
	c := newCache(h, clk, shardcache.Options{Timeout: time.Minute, Holder: "b", Peers: func() int { return 2 }})
	p := algo.Params{Kind: k, Limit: 1_000, Period: time.Hour}
	key := []byte("inflight")
	want := algo.OpTakeLease
	if path == "sync" {
		want = algo.OpLease
	}
	var armed, fired atomic.Bool
	armed.Store(path == "take")
	h.after = func(ops []algo.Op) {
		for i := range ops {
			op := &ops[i]
			if op.Kind == want && op.Holder == "b" && op.Granted > 0 && armed.Load() && !fired.Swap(true) {
				if recalled {
					c.Recalled(key, k, clk.Now())
				}
			}
		}
	}
	take := func() {
		r, err := c.Take(ctx, key, p, 1, clk.Now(), false)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	if path == "sync" {
		// A key turning hot: checks every quarter interval until the
		// sync tops its lease up.
		l := newLoops(clk, shardcache.DefaultSyncInterval, c)
		armed.Store(true)
		for i := 0; !fired.Load(); i++ {
			require.Less(t, i, 200, "no top-up")
			for range 5 {
				take()
			}
			l.advance(shardcache.DefaultSyncInterval / 4)
		}
	} else {
		take()
		require.True(t, fired.Load(), "the check's call leased units")
	}
	if !recalled {
		lease, _, _ := c.Held(key)
		assert.Positive(t, lease, "the grant is kept")
		assert.Positive(t, h.out(string(key), p, "b"))
		return
	}
	// Polled, not slept on: the return is a call of its own.
	require.Eventually(t, func() bool { return h.out(string(key), p, "b") == 0 }, 5*time.Second, time.Millisecond,
		"the grant went back to the store")
	lease, _, _ := c.Held(key)
	assert.Zero(t, lease, "the daemon holds nothing of the recalled key")
}

// TestRecallWaitUsesOwnLease: daemon a's take is refused by the store
// while units are parked (daemon b holds one, and does not answer the
// recall); while a waits on its recall, its own sync tops its lease up
// with the last units the store had (its view of the key is from before
// the store ran dry). Those units count as parked too: a admits its
// check from them at once, with no further store call, rather than
// retrying the store for them in vain until RecallWait (holding the
// key's flight, and every check behind it, that long).
func TestRecallWaitUsesOwnLease(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			p := algo.Params{Kind: k, Limit: 100, Period: time.Hour}
			key := []byte("own")
			var ca *shardcache.Cache
			var l *loops
			var drained int64
			drainedAt := b.clk.Now()
			var recalls, syncsAfter atomic.Int64
			ca = newCache(b, b.clk, shardcache.Options{
				Timeout: time.Minute, RecallWait: time.Second, Holder: "a", Peers: func() int { return 2 },
				Recall: func(context.Context, []byte, algo.Kind) error {
					recalls.Add(1)
					// Two of the drained units come back to the store,
					// and a's sync runs while the take waits.
					assert.NoError(t, b.Refund(ctx, key, p, 2, drainedAt, b.clk.Now()))
					l.advance(shardcache.DefaultSyncInterval)
					syncsAfter.Store(b.syncs.Load())
					return nil
				},
			})
			l = newLoops(b.clk, shardcache.DefaultSyncInterval, ca)
			cb := newCache(b, b.clk, shardcache.Options{Timeout: time.Minute, Holder: "b", Peers: func() int { return 2 }})
			r, err := cb.Take(ctx, key, p, 1, b.clk.Now(), false)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.Positive(t, b.out(string(key), p, "b"), "b holds a lease")
			for range 30 {
				r, err := ca.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed)
			}
			// Another client takes what is left at the store; a's view
			// still has room.
			drained = b.remaining(string(key), p)
			require.Positive(t, drained)
			_, err = b.Take(ctx, key, p, drained, drainedAt, false)
			require.NoError(t, err)
			// a spends its lease, then its next check goes to the store.
			for {
				lease, _, _ := ca.Held(key)
				if lease == 0 {
					break
				}
				r, err := ca.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed)
			}
			r, err = ca.Take(ctx, key, p, 1, b.clk.Now(), false)
			require.NoError(t, err)
			require.EqualValues(t, 1, recalls.Load(), "the store refused the take with units parked")
			assert.True(t, r.Allowed, "admitted from a's own lease: %+v", r)
			assert.Equal(t, syncsAfter.Load(), b.syncs.Load(), "no store call after the recall's sync")
			lease, _, _ := ca.Held(key)
			assert.EqualValues(t, 1, lease, "the other unit stays a's")
		})
	}
}

// TestUnsettledRefusalIsNotKept: daemon b's take is refused while
// daemon a holds units of the key, and b's recall does not reach a in
// time (lost here; on a loaded host, late). b refuses the check, but
// keeps no denial of the key: the refusal was not the store's. Once a
// gives its lease back (the recall arriving late), b's next check asks
// the store and is admitted, where a kept denial would refuse it for up
// to a sync interval.
func TestUnsettledRefusalIsNotKept(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := newAlgoBackend()
			ca, cb := recallPair(b, true)
			p := algo.Params{Kind: k, Limit: 40, Period: time.Hour}
			key := []byte("unsettled")
			for range 12 {
				r, err := ca.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed)
			}
			held, _, _ := ca.Held(key)
			require.Positive(t, held, "a holds no lease")
			for i := 0; ; i++ {
				require.Less(t, i, int(p.Limit), "b is never refused")
				r, err := cb.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				if !r.Allowed {
					break
				}
			}
			ca.Recalled(key, k, b.clk.Now())
			require.Eventually(t, func() bool { return b.remaining(string(key), p) >= held }, 5*time.Second, time.Millisecond,
				"a's lease went back")
			r, err := cb.Take(ctx, key, p, 1, b.clk.Now(), false)
			require.NoError(t, err)
			assert.True(t, r.Allowed, "b's next check, with a's units back at the store: %+v", r)
		})
	}
}

// slowRefusalBackend is an algoBackend that answers the first
// take-with-lease of holder it refuses with units parked only once the
// caller's context has ended, as a loaded Redis answers a call at the
// end of store.timeout; like a real client, it sends nothing on a
// context that has ended.
type slowRefusalBackend struct {
	*algoBackend
	holder string
	fired  atomic.Bool
}

func (s *slowRefusalBackend) Sync(ctx context.Context, ops []algo.Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.algoBackend.Sync(ctx, ops)
	for _, op := range ops {
		if op.Kind == algo.OpTakeLease && op.Holder == s.holder && op.Admitted < len(op.Costs) && op.Parked > 0 && !s.fired.Swap(true) {
			<-ctx.Done()
		}
	}
	return err
}

// TestRecallAfterSlowRefusal: daemon b's take is refused by the store
// while daemon a holds units of the key, and the store's answer comes
// as the call's time (store.timeout) runs out. The recall still goes
// out and its retry still runs, on a budget of their own: b's check is
// admitted from a's returned units, and the two admit exactly the
// limit. On what was left of the call's time, the recall was never
// sent (a publish on an ended context fails) and the check was refused
// with a's units parked.
func TestRecallAfterSlowRefusal(t *testing.T) {
	for _, k := range cachedKinds {
		t.Run(k.String(), func(t *testing.T) {
			b := &slowRefusalBackend{algoBackend: newAlgoBackend(), holder: "b"}
			var ca, cb *shardcache.Cache
			o := func(holder string, other **shardcache.Cache) shardcache.Options {
				return shardcache.Options{
					Timeout: 50 * time.Millisecond, RecallWait: 25 * time.Millisecond, Holder: holder, Peers: func() int { return 2 },
					Recall: func(ctx context.Context, key []byte, kind algo.Kind) error {
						if err := ctx.Err(); err != nil {
							return err // not published
						}
						(*other).Recalled(key, kind, b.clk.Now())
						return nil
					},
				}
			}
			ca = newCache(b, b.clk, o("a", &cb))
			cb = newCache(b, b.clk, o("b", &ca))
			p := algo.Params{Kind: k, Limit: 40, Period: time.Hour}
			key := []byte("slow")
			var admitted int64
			for range 12 {
				r, err := ca.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				admitted++
			}
			held, _, _ := ca.Held(key)
			require.Positive(t, held, "a holds no lease")
			for i := 0; ; i++ {
				require.Less(t, i, int(p.Limit), "b is never refused")
				before := b.fired.Load()
				r, err := cb.Take(ctx, key, p, 1, b.clk.Now(), false)
				require.NoError(t, err)
				if !r.Allowed {
					require.True(t, before, "the check the store refused late, with a's units parked, is refused: %+v", r)
					break
				}
				admitted++
			}
			assert.True(t, b.fired.Load(), "the store refused b with a's units parked")
			assert.Equal(t, p.Limit, admitted, "a and b admitted the whole limit")
		})
	}
}
