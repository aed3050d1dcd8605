package algo_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/lua"
)

// TestTablesComplete: every OpKind and every Kind has its row: a name,
// a reply of 5 or 7 integers and its arguments for an op; a unique key
// suffix and a script (lua.Source, lua.OnceSource) for an algorithm.
func TestTablesComplete(t *testing.T) {
	for k := range algo.NumOpKinds {
		in := k.Info()
		assert.NotEmpty(t, in.Name, "op %d", k)
		assert.Contains(t, []int{5, 7}, in.Reply, k)
		assert.NotEmpty(t, in.Args, k)
	}
	assert.Empty(t, algo.NumOpKinds.Info().Name, "an unknown op has no properties")
	suffixes := map[string]algo.Kind{}
	for k := range algo.NumKinds {
		in := k.Info()
		assert.Equal(t, k.String(), in.Name)
		assert.NotEmpty(t, in.KeySuffix, k)
		assert.NotContains(t, suffixes, in.KeySuffix, "%s shares its key suffix", k)
		suffixes[in.KeySuffix] = k
		_, ok := lua.Source(in.Name)
		assert.True(t, ok, "no script for %s", k)
		_, ok = lua.OnceSource(in.Name)
		assert.True(t, ok, "no once script for %s", k)
		got, err := algo.ParseKind(in.Name)
		assert.NoError(t, err)
		assert.Equal(t, k, got)
	}
	assert.False(t, algo.NumKinds.Windowed())
	assert.Equal(t, algo.LeaseNone, algo.NumKinds.Info().Leases)
}

// TestOpCheck: Check refuses the ops that its kind's row says cannot run,
// with algo.ErrInvalidOp, and CheckOnce the Once ids an op cannot carry.
func TestOpCheck(t *testing.T) {
	tb := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Second}
	cc := algo.Params{Kind: algo.Concurrency, Limit: 10, Period: time.Second}
	for _, c := range []struct {
		op       algo.Op
		ok, once bool
	}{
		{algo.Op{Kind: algo.OpTake, Params: tb, N: 0}, true, true},
		{algo.Op{Kind: algo.OpRefund, Params: tb, N: 0}, false, false},
		{algo.Op{Kind: algo.OpRefund, Params: tb, N: 1}, true, true},
		{algo.Op{Kind: algo.OpTakeLease, Params: tb, N: 1}, false, false},
		{algo.Op{Kind: algo.OpTakeLease, Params: tb, N: -1, Costs: []int64{1}}, false, false},
		{algo.Op{Kind: algo.OpTakeLease, Params: tb, N: 0, Costs: []int64{1}}, true, false},
		{algo.Op{Kind: algo.OpAcquire, Params: tb, Slots: []uint64{1}}, false, false},
		{algo.Op{Kind: algo.OpAcquire, Params: cc, Slots: []uint64{1, 0}}, false, false},
		{algo.Op{Kind: algo.OpAcquire, Params: cc, Slots: []uint64{1, 2}}, true, false},
		{algo.Op{Kind: algo.OpRelease, Params: cc, N: 1, Slot: 3}, true, false},
		{algo.Op{Kind: algo.OpRelease, Params: cc, N: 1}, true, true},
		{algo.Op{Kind: algo.NumOpKinds, Params: tb}, false, false},
	} {
		err := c.op.Check()
		if c.ok {
			assert.NoError(t, err, "%+v", c.op)
		} else {
			assert.ErrorIs(t, err, algo.ErrInvalidOp, "%+v", c.op)
		}
		c.op.Once = 7
		err = c.op.CheckOnce()
		if c.once {
			assert.NoError(t, err, "once %+v", c.op)
		} else {
			assert.ErrorIs(t, err, algo.ErrInvalidOp, "once %+v", c.op)
		}
	}
}

// TestSetReply: each op's reply sets the outcome fields its row names,
// and Allowed as its Verdict says.
func TestSetReply(t *testing.T) {
	p := algo.Params{Kind: algo.TokenBucket, Limit: 10, Period: time.Second}
	reply := func(first int64, more ...int64) []int64 {
		return append([]int64{first, 4, 1000, 0, 77}, more...)
	}
	op := algo.Op{Kind: algo.OpTake, Params: p}
	op.SetReply(reply(1))
	assert.Equal(t, algo.Result{Allowed: true, Limit: 10, Remaining: 4, Reset: time.Millisecond, At: 77}, op.Result)
	op = algo.Op{Kind: algo.OpLease, Params: p}
	op.SetReply(reply(3))
	assert.Equal(t, int64(3), op.Granted)
	assert.True(t, op.Result.Allowed)
	op = algo.Op{Kind: algo.OpTakeLease, Params: p, Costs: []int64{1, 1}}
	op.SetReply(reply(1, 0, 6))
	assert.Equal(t, 1, op.Admitted)
	assert.Equal(t, int64(6), op.Parked)
	assert.False(t, op.Result.Allowed, "one of two costs admitted, nothing leased")
	op.SetReply(reply(2, 5, 0))
	assert.Equal(t, int64(5), op.Granted)
	assert.True(t, op.Result.Allowed)
	op = algo.Op{Kind: algo.OpRelease, Params: p}
	op.SetReply(reply(1))
	assert.Equal(t, 1, op.Admitted)
	assert.False(t, op.Result.Allowed, "a release decides nothing")
	op = algo.Op{Kind: algo.OpRefund, Params: p}
	v := reply(1)
	v[3] = -1
	op.SetReply(v)
	assert.False(t, op.Result.Allowed)
	assert.Equal(t, algo.Never, op.Result.RetryAfter)
}
