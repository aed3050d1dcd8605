package algo

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestApply: each op kind does what its function does, on the same state.
func TestApply(t *testing.T) {
	p := Params{Kind: TokenBucket, Limit: 10, Period: time.Second}
	const now = 1_000_000
	var s, ref State

	op := Op{Kind: OpTake, Params: p, N: 3}
	Apply(&op, &s, now)
	assert.Equal(t, Decide(p, &ref, now, 3, false), op.Result)

	op = Op{Kind: OpPeek, Params: p, N: 2}
	Apply(&op, &s, now)
	assert.Equal(t, Decide(p, &ref, now, 2, true), op.Result)

	op = Op{Kind: OpLease, Params: p, N: 4}
	Apply(&op, &s, now)
	g, r := Lease(p, &ref, now, 4)
	assert.Equal(t, g, op.Granted)
	assert.Equal(t, r, op.Result)

	op = Op{Kind: OpTakeLease, Params: p, N: 5, Costs: []int64{1, 1}}
	Apply(&op, &s, now)
	n, l, r := TakeLease(p, &ref, now, []int64{1, 1}, 5)
	assert.Equal(t, n, op.Admitted)
	assert.Equal(t, l, op.Granted)
	assert.Equal(t, r, op.Result)

	op = Op{Kind: OpRefund, Params: p, N: 4, TakenAt: now}
	Apply(&op, &s, now)
	Refund(p, &ref, now, now, 4)
	r = Decide(p, &ref, now, 1, true)
	r.Allowed, r.RetryAfter = false, 0
	assert.Equal(t, r, op.Result)
	assert.Equal(t, ref, s)

	assert.Equal(t, "takelease", OpTakeLease.String())
	assert.Panics(t, func() { Apply(&Op{Kind: NumOpKinds, Params: p}, &s, now) })
}

// TestResetGrant: a reset leaves a fresh key on every algorithm; a grant
// of n after n+1 admissions lets exactly n more in, and never more than a
// fresh key has.
func TestResetGrant(t *testing.T) {
	const now = 10_000_000
	for k := TokenBucket; k <= FixedWindow; k++ {
		p := Params{Kind: k, Limit: 10, Period: time.Minute}
		var s State
		for range 10 {
			assert.True(t, Decide(p, &s, now, 1, false).Allowed, k)
		}
		op := Op{Kind: OpGrant, Params: p, N: 3}
		Apply(&op, &s, now)
		// Remaining is that of a peek of 1: after that unit.
		assert.Equal(t, int64(2), op.Result.Remaining, k)
		assert.False(t, op.Result.Allowed, k)
		for range 3 {
			assert.True(t, Decide(p, &s, now, 1, false).Allowed, k)
		}
		assert.False(t, Decide(p, &s, now, 1, false).Allowed, k)

		op = Op{Kind: OpGrant, Params: p, N: 1000}
		Apply(&op, &s, now)
		assert.Equal(t, int64(9), op.Result.Remaining, k)

		Decide(p, &s, now, 4, false)
		op = Op{Kind: OpReset, Params: p}
		Apply(&op, &s, now)
		assert.True(t, Idle(p, &s, now), k)
		var fresh State
		assert.Equal(t, Decide(p, &fresh, now, 1, true), Decide(p, &s, now, 1, true), k)
	}

	// A sliding log's grant removes the oldest admissions first.
	p := Params{Kind: SlidingLog, Limit: 10, Period: time.Second}
	s := State{Log: []Entry{{At: 1, Cost: 5}, {At: now - 900_000, Cost: 2}, {At: now - 500_000, Cost: 3}, {At: now, Cost: 4}}}
	Grant(p, &s, now, 4)
	assert.Equal(t, []Entry{{At: now - 500_000, Cost: 1}, {At: now, Cost: 4}}, s.Log)
}
