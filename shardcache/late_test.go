package shardcache_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/shardcache"
)

// lateBackend is an algoBackend whose Sync runs a take-with-lease of a
// key starting with "late" only once release is closed, as a loaded
// Redis answers a call after store.timeout, and whose Sync sends nothing
// while refuse is set, as a circuit breaker that is open.
type lateBackend struct {
	*algoBackend
	release chan struct{}
	refuse  atomic.Bool
}

func newLateBackend() *lateBackend {
	return &lateBackend{algoBackend: newAlgoBackend(), release: make(chan struct{})}
}

// errOpen is a circuit breaker's refusal: it tells when the store may
// next be tried, as breaker.OpenError does.
type errOpen struct{}

func (errOpen) Error() string        { return "circuit breaker open" }
func (errOpen) NextTry() time.Time   { return time.Now().Add(time.Second) }
func (b *lateBackend) refused() bool { return b.refuse.Load() }

func (b *lateBackend) Sync(ctx context.Context, ops []algo.Op) error {
	if b.refused() {
		for i := range ops {
			ops[i].Err = errOpen{}
		}
		return errOpen{}
	}
	for _, op := range ops {
		if op.Kind == algo.OpTakeLease && strings.HasPrefix(string(op.Key), "late") {
			select {
			case <-b.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return b.algoBackend.Sync(ctx, ops)
}

// out returns the units holder has out on lease of key, as the store
// counts them.
func (b *algoBackend) out(key string, p algo.Params, holder string) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, o := range b.state([]byte(key), p).Out {
		if o.Holder == holder && o.Until > b.clock() {
			return o.Units
		}
	}
	return 0
}

// TestLateGrantGoesBack: while the store is slow (a take-with-lease
// has timed out), a take-with-lease that the store answers after the
// check's timeout still runs there; the check fails (its rule's fail
// mode answers it), and the units the call leased go back to the store
// when its answer comes, instead of staying counted out on lease with no
// daemon holding them: the key is left with the limit less the check the
// call admitted, and nothing out.
func TestLateGrantGoesBack(t *testing.T) {
	b := newLateBackend()
	c := newCache(b, b.clk, shardcache.Options{Timeout: 20 * time.Millisecond, Holder: "a"})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 100, Period: time.Hour}
	// The first call, of another key, shows the store slow, and is not run.
	for _, key := range []string{"late-first", "late"} {
		_, err := c.Take(ctx, []byte(key), p, 1, b.clk.Now(), false)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	close(b.release) // the store answers now
	require.Eventually(t, func() bool {
		return b.remaining("late", p) == p.Limit-1
	}, 5*time.Second, time.Millisecond, "the late grant went back")
	assert.Zero(t, b.out("late", p, "a"), "units out on lease")
	lease, _, _ := c.Held([]byte("late"))
	assert.Zero(t, lease, "the cache holds no lease of the late call")
}

// TestUnsentSpentIsReported: the units a daemon admitted from its lease
// are reported with the key's next op; when a circuit breaker refuses
// that op (nothing was sent), they are reported by the op after it,
// so that the store counts out exactly what the daemon still holds.
func TestUnsentSpentIsReported(t *testing.T) {
	b := newLateBackend()
	c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second, Holder: "a"})
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
	key := []byte("k")
	take := func() error {
		_, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
		return err
	}
	require.NoError(t, take())
	lease, _, _ := c.Held(key)
	require.Positive(t, lease)
	for range lease {
		require.NoError(t, take()) // from the lease
	}
	b.refuse.Store(true)
	require.ErrorAs(t, take(), new(errOpen), "the miss's call is refused")
	_, spent, _ := c.Held(key)
	assert.Equal(t, lease, spent, "the units admitted are still to report")
	b.refuse.Store(false)
	require.NoError(t, take())
	lease2, spent2, _ := c.Held(key)
	assert.Equal(t, lease2+spent2, b.out("k", p, "a"), "the store counts out what the cache holds")
}

// TestUnsentReturnIsKept: a lease's return that a circuit breaker
// refuses stays the cache's lease, and goes back at a later tick once
// the store answers: the store never counts out units no daemon holds.
func TestUnsentReturnIsKept(t *testing.T) {
	b := newLateBackend()
	const interval = 100 * time.Millisecond
	c := newCache(b, b.clk, shardcache.Options{Timeout: time.Second, Holder: "a", SyncInterval: interval})
	l := newLoops(b.clk, interval, c)
	p := algo.Params{Kind: algo.TokenBucket, Limit: 1000, Period: time.Hour}
	key := []byte("k")
	for range 20 { // a hot key: a lease of its traffic
		_, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
		require.NoError(t, err)
	}
	lease, _, _ := c.Held(key)
	require.Positive(t, lease)
	b.refuse.Store(true)
	l.advance(interval) // idle: its return is refused
	kept, _, ok := c.Held(key)
	require.True(t, ok)
	assert.Equal(t, lease, kept, "the lease whose return was refused is kept")
	b.refuse.Store(false)
	l.advance(interval)
	back, spent, _ := c.Held(key)
	assert.Zero(t, back, "returned at a later tick")
	assert.Equal(t, back+spent, b.out("k", p, "a"), "the store counts out what the cache holds")
}

// lostAnswerBackend is an algoBackend that runs the first
// take-with-lease of the key "lost" and then loses its answer: the
// caller gets its context's error once its time is up, as from a loaded
// Redis that ran a call after the client stopped waiting for it.
type lostAnswerBackend struct {
	*algoBackend
	lost atomic.Bool
}

func (b *lostAnswerBackend) Sync(ctx context.Context, ops []algo.Op) error {
	err := b.algoBackend.Sync(ctx, ops)
	for _, op := range ops {
		if op.Kind == algo.OpTakeLease && string(op.Key) == "lost" && !b.lost.Swap(true) {
			<-ctx.Done()
			return ctx.Err()
		}
	}
	return err
}

// TestLostGrantIsReclaimed: the take-with-lease that first shows the
// store slow is waited for in line, and times out after the store ran
// it: its answer, and with it the (warm) lease it granted, is lost. The
// units go back to the store once the call has surely landed: the store
// then counts none out for the daemon, which holds none, and the bucket
// lacks only the check the call admitted; without that, they stayed
// counted out for the warm lease's lifetime (5 min), recalled in vain
// by every refusal of the key. The key's next check leases again.
func TestLostGrantIsReclaimed(t *testing.T) {
	for _, k := range []algo.Kind{algo.TokenBucket, algo.GCRA} {
		t.Run(k.String(), func(t *testing.T) {
			b := &lostAnswerBackend{algoBackend: newAlgoBackend()}
			c := newCache(b, b.clk, shardcache.Options{
				Timeout: 20 * time.Millisecond, SyncInterval: 50 * time.Millisecond, Holder: "a",
				Recall: func(context.Context, []byte, algo.Kind) error { return nil }, // warm leases
			})
			p := algo.Params{Kind: k, Limit: 1000, Period: time.Hour}
			key := []byte("lost")
			_, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			granted := b.out("lost", p, "a")
			require.Positive(t, granted, "the lost call granted a lease")
			lease, _, _ := c.Held(key)
			require.Zero(t, lease, "the daemon holds none of it")
			require.Eventually(t, func() bool { return b.out("lost", p, "a") == 0 }, 5*time.Second, time.Millisecond,
				"the lost grant of %d units went back", granted)
			assert.Equal(t, p.Limit-1, b.remaining("lost", p), "the bucket lacks only the check the lost call admitted")
			// The key leases nothing until the reclaim's window (two
			// sync intervals and one more) is over, then leases again.
			b.clk.set(b.clk.Now().Add(3 * 50 * time.Millisecond))
			r, err := c.Take(ctx, key, p, 1, b.clk.Now(), false)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			lease, spent, _ := c.Held(key)
			assert.Positive(t, lease, "the key leases again")
			assert.Equal(t, lease+spent, b.out("lost", p, "a"), "the store counts out what the cache holds")
		})
	}
}
