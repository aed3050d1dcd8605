package redisx_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// TestChanges: entries put with a ttl (from Redis TIME) or an absolute
// expiry, loaded until they expire, deleted; each change bumps the
// version and is announced to a subscriber; an expiry in the past is
// refused.
func TestChanges(t *testing.T) {
	srv := redistest.Standalone(t)
	ch := redisx.NewChanges(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, KeyPrefix: "t:"}))
	assert.Equal(t, "{t:changes}", ch.Key())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	subscribed := make(chan struct{}, 1)
	announced := make(chan int64, 16)
	done := make(chan error, 1)
	go func() {
		done <- ch.Subscribe(ctx, func() { subscribed <- struct{}{} }, func(v int64) { announced <- v })
	}()
	select {
	case <-subscribed:
	case err := <-done:
		t.Fatalf("subscribe: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("not subscribed within 5s")
	}

	st0, err := ch.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(0), st0.Version)
	assert.Less(t, st0.Skew().Abs(), time.Second, "Redis TIME and this clock are the same host's")

	exp, st, err := ch.Put(ctx, "o-1", `{"x":1}`, time.Time{}, 300*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Version)
	assert.WithinDuration(t, st.Redis.Add(300*time.Millisecond), exp, 2*time.Millisecond)
	assert.Equal(t, int64(1), <-announced)
	at := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	exp2, _, err := ch.Put(ctx, "b-2", `{"y":2}`, at, 0)
	require.NoError(t, err)
	assert.True(t, at.Equal(exp2))
	assert.Equal(t, int64(2), <-announced)

	entries, tombs, st, err := ch.Load(ctx)
	require.NoError(t, err)
	assert.Empty(t, tombs)
	assert.NotEmpty(t, st.Epoch, "the first put gave the hash an epoch")
	assert.Equal(t, int64(2), st.Version)
	assert.Equal(t, map[string]redisx.ChangeEntry{
		"o-1": {Expires: exp, Value: `{"x":1}`},
		"b-2": {Expires: exp2, Value: `{"y":2}`},
	}, entries)

	_, _, err = ch.Put(ctx, "o-3", `{}`, time.Now().Add(-time.Minute), 0)
	assert.ErrorContains(t, err, "expiry not after Redis TIME")

	redistest.WaitFor(t, "o-1 to expire", func() bool {
		entries, _, _, err := ch.Load(ctx)
		return err == nil && len(entries) == 1
	})
	n, err := redistest.Do(srv.Addr, "HLEN", "{t:changes}")
	require.NoError(t, err)
	assert.Equal(t, "3", n, "the expired entry is removed: b-2, the version and the epoch remain")

	ok, st, err := ch.Delete(ctx, "b-2")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, int64(3), st.Version)
	assert.Equal(t, int64(3), <-announced)
	ok, st, err = ch.Delete(ctx, "b-2")
	require.NoError(t, err)
	assert.False(t, ok, "deleting twice")
	assert.Equal(t, int64(3), st.Version, "a delete of nothing changes nothing")
	_, tombs, _, err = ch.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]time.Time{"b-2": exp2}, tombs, "the deleted entry's tombstone lasts until its expiry")

	cancel()
	assert.NoError(t, <-done)
}

// TestChangesRestore: on a hash that Redis lost, Restore writes back the
// entries not expired and not deleted with their values and expiries,
// keeps the tombstones, gives the hash a new epoch and a version above
// the one the caller knew (Began); a second Restore joins it (not Began)
// and adds only what the hash lacks.
func TestChangesRestore(t *testing.T) {
	srv := redistest.Standalone(t)
	ch := redisx.NewChanges(newClient(t, redisx.Options{Addrs: []string{srv.Addr}, KeyPrefix: "t:"}))
	ctx := context.Background()
	_, _, err := ch.Put(ctx, "o-1", `{"a":1}`, time.Time{}, time.Hour)
	require.NoError(t, err)
	_, _, err = ch.Put(ctx, "o-2", `{"a":2}`, time.Time{}, time.Hour)
	require.NoError(t, err)
	_, _, err = ch.Delete(ctx, "o-2")
	require.NoError(t, err)
	entries, tombs, st, err := ch.Load(ctx)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Len(t, tombs, 1)
	epoch := st.Epoch

	_, err = redistest.Do(srv.Addr, "FLUSHALL")
	require.NoError(t, err)
	st, err = ch.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, "", st.Epoch, "a hash Redis lost has no epoch")

	// A daemon that missed the delete holds o-2 still; one holds an
	// entry that has expired since.
	stale := map[string]redisx.ChangeEntry{
		"o-2": {Expires: tombs["o-2"], Value: `{"a":2}`}, // as it was before its delete
		"o-3": {Expires: time.Now().Add(-time.Second).Truncate(time.Millisecond), Value: `{"a":3}`},
	}
	res, st, err := ch.Restore(ctx, 7, stale, nil)
	require.NoError(t, err)
	assert.Equal(t, redisx.Restored{Began: true, Entries: 1}, res, "o-2 back (no tombstone yet), o-3 expired")
	assert.NotEqual(t, epoch, st.Epoch)
	assert.Equal(t, int64(8), st.Version)

	res, st2, err := ch.Restore(ctx, 3, entries, tombs)
	require.NoError(t, err)
	assert.Equal(t, redisx.Restored{Began: false, Entries: 1}, res, "joins: o-1 back")
	assert.Equal(t, st.Epoch, st2.Epoch)
	assert.Equal(t, int64(9), st2.Version)
	got, gotTombs, _, err := ch.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, entries, got, "o-1 as it was; o-2 deleted again by its tombstone")
	assert.Equal(t, tombs, gotTombs)

	// An entry put again under a deleted id (an automatic block's is
	// the same for its key) ends the tombstone; a restore holding the
	// old tombstone does not delete the new entry, whose expiry differs.
	exp2, _, err := ch.Put(ctx, "o-2", `{"a":22}`, time.Time{}, 2*time.Hour)
	require.NoError(t, err)
	_, gotTombs, _, err = ch.Load(ctx)
	require.NoError(t, err)
	assert.Empty(t, gotTombs)
	_, _, err = ch.Restore(ctx, 0, nil, tombs)
	require.NoError(t, err)
	got, _, _, err = ch.Load(ctx)
	require.NoError(t, err)
	assert.Equal(t, redisx.ChangeEntry{Expires: exp2, Value: `{"a":22}`}, got["o-2"])
}
