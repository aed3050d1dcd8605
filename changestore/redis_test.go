package changestore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/changestore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// redisStore returns a store of changes on the Redis at addr, as one
// daemon of a fleet has it.
func redisStore(t *testing.T, addr string) *changestore.Redis {
	t.Helper()
	c, err := redisx.New(context.Background(), redisx.Options{Addrs: []string{addr}, Timeout: time.Second, KeyPrefix: "rld:"})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return changestore.NewRedis(c, quiet())
}

// TestRedisStoreSharesChanges: what one daemon's store adds, another's
// loads, overrides in the order of creation; a remove with the other
// kind's prefix removes nothing.
func TestRedisStoreSharesChanges(t *testing.T) {
	srv := redistest.Standalone(t)
	a, b := redisStore(t, srv.Addr), redisStore(t, srv.Addr)
	ctx := context.Background()
	first := policy.Override{ID: changestore.NewID("o-"), Rule: "r", Key: map[string]string{"k": "1"}, Limit: 5, Created: time.Now()}
	second := policy.Override{ID: changestore.NewID("o-"), Rule: "r", Match: map[string]string{"k": "*"}, Limit: 7, Created: first.Created.Add(time.Millisecond)}
	require.NoError(t, a.AddOverride(ctx, &second, time.Hour))
	require.NoError(t, a.AddOverride(ctx, &first, time.Hour))
	blk := policy.Block{ID: changestore.NewID("b-"), Match: map[string]string{"ip": "10.*"}}
	require.NoError(t, a.AddBlock(ctx, &blk, time.Minute))
	assert.True(t, blk.Expires.After(time.Now().Add(50*time.Second)), "the ttl set the expiry by Redis TIME")

	ch, err := b.Load(ctx)
	require.NoError(t, err)
	require.Len(t, ch.Overrides, 2)
	assert.Equal(t, []string{first.ID, second.ID}, []string{ch.Overrides[0].ID, ch.Overrides[1].ID}, "the order of creation")
	require.Len(t, ch.Blocks, 1)
	assert.Equal(t, blk.ID, ch.Blocks[0].ID)

	ok, err := b.Remove(ctx, true, blk.ID)
	require.NoError(t, err)
	assert.False(t, ok, "a block's id does not name an override")
	ok, err = b.Remove(ctx, false, blk.ID)
	require.NoError(t, err)
	assert.True(t, ok)
	ch, err = a.Load(ctx)
	require.NoError(t, err)
	assert.Empty(t, ch.Blocks)
	assert.Len(t, ch.Overrides, 2)
}

// TestRedisStoreRestoresWhatRedisLost: after Redis loses the hash (a
// restart without persistence, here FLUSHALL), the next load of a store
// that had loaded the set writes it back, and another store loads it.
func TestRedisStoreRestoresWhatRedisLost(t *testing.T) {
	srv := redistest.Standalone(t)
	a := redisStore(t, srv.Addr)
	ctx := context.Background()
	o := policy.Override{ID: changestore.NewID("o-"), Rule: "r", Key: map[string]string{"k": "1"}, Limit: 5}
	require.NoError(t, a.AddOverride(ctx, &o, time.Hour))
	_, err := a.Load(ctx)
	require.NoError(t, err)

	_, err = redistest.Do(srv.Addr, "FLUSHALL")
	require.NoError(t, err)
	ch, err := a.Load(ctx)
	require.NoError(t, err)
	require.Len(t, ch.Overrides, 1, "the set in force is kept and written back")

	ch, err = redisStore(t, srv.Addr).Load(ctx)
	require.NoError(t, err)
	require.Len(t, ch.Overrides, 1, "another daemon finds the restored set")
	assert.Equal(t, o.ID, ch.Overrides[0].ID)
}

// TestRedisWatchApplies: a change stored by one daemon is applied by
// another's Watch (by the announcement or the poll), and an apply that
// fails is tried again.
func TestRedisWatchApplies(t *testing.T) {
	srv := redistest.Standalone(t)
	a, b := redisStore(t, srv.Addr), redisStore(t, srv.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var seen []int
	failOnce := true
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Watch(ctx, 100*time.Millisecond, func(ctx context.Context) error {
			ch, err := b.Load(ctx)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if failOnce && len(ch.Overrides) > 0 {
				failOnce = false
				return context.DeadlineExceeded
			}
			seen = append(seen, len(ch.Overrides))
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	o := policy.Override{ID: changestore.NewID("o-"), Rule: "r", Key: map[string]string{"k": "1"}, Limit: 5}
	require.NoError(t, a.AddOverride(context.Background(), &o, time.Hour))
	redistest.WaitFor(t, "the other daemon applies the change", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && seen[len(seen)-1] == 1
	})
	mu.Lock()
	assert.False(t, failOnce, "the failed apply was tried again")
	mu.Unlock()
}
