package redisx_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/redistest"
	"github.com/rld/rld/redisx"
)

// TestAcquireSlotsOneCall: two slots acquired in one Redis call share a
// time; releasing the first twice frees it once, the second stays held
// (ZCARD and the next acquires say so), and a release by time alone or
// with another id frees nothing.
func TestAcquireSlotsOneCall(t *testing.T) {
	srv := redistest.Standalone(t)
	rs := redisx.NewStore(newClient(t, redisx.Options{Addrs: []string{srv.Addr}}))
	ctx := context.Background()
	p := algo.Params{Kind: algo.Concurrency, Limit: 3, Period: time.Minute}
	key := []byte("cc\x00one-call")
	rkey := string(redisx.AppendKey(nil, "t:", key, algo.Concurrency))
	do := func(op algo.Op) algo.Op {
		t.Helper()
		op.Key, op.Params = key, p
		ops := []algo.Op{op}
		require.NoError(t, rs.Do(ctx, ops))
		require.NoError(t, ops[0].Err)
		return ops[0]
	}
	zcard := func() int64 {
		t.Helper()
		n, err := redistest.Do(srv.Addr, "ZCARD", rkey)
		require.NoError(t, err)
		v, err := strconv.ParseInt(n, 10, 64)
		require.NoError(t, err)
		return v
	}
	const a, b = 0x0123456789abcdef, 0xfedcba9876543210
	acq := do(algo.Op{Kind: algo.OpAcquire, Slots: []uint64{a, b}})
	require.Equal(t, 2, acq.Admitted)
	require.True(t, acq.Result.Allowed)
	at := acq.Result.At
	require.EqualValues(t, 2, zcard())

	assert.Equal(t, 1, do(algo.Op{Kind: algo.OpRelease, N: 1, TakenAt: at, Slot: a}).Admitted)
	assert.Equal(t, 0, do(algo.Op{Kind: algo.OpRelease, N: 1, TakenAt: at, Slot: a}).Admitted, "A released twice")
	assert.Equal(t, 0, do(algo.Op{Kind: algo.OpRelease, N: 1, TakenAt: at}).Admitted, "by time alone")
	assert.Equal(t, 0, do(algo.Op{Kind: algo.OpRelease, N: 1, TakenAt: at, Slot: a + 1}).Admitted, "another id")
	assert.EqualValues(t, 1, zcard(), "B's slot is held")

	more := do(algo.Op{Kind: algo.OpAcquire, Slots: []uint64{1, 2, 3}})
	assert.Equal(t, 2, more.Admitted, "B holds the third slot")
	assert.False(t, more.Result.Allowed)
	assert.EqualValues(t, 3, zcard())
	assert.Equal(t, 1, do(algo.Op{Kind: algo.OpRelease, N: 1, TakenAt: at, Slot: b}).Admitted)

	// What cannot be sent is refused and sends nothing.
	for _, bad := range []algo.Op{
		{Kind: algo.OpAcquire, Key: key, Params: p},
		{Kind: algo.OpAcquire, Key: key, Params: p, Slots: []uint64{0}},
		{Kind: algo.OpAcquire, Key: key, Params: algo.Params{Kind: algo.SlidingLog, Limit: 3, Period: time.Minute}, Slots: []uint64{9}},
	} {
		ops := []algo.Op{bad}
		require.NoError(t, rs.Do(ctx, ops))
		assert.Error(t, ops[0].Err, "%+v", bad)
	}
	assert.EqualValues(t, 2, zcard())
}
