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
