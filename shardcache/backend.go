package shardcache

import (
	"context"
	"time"

	"github.com/rld/rld/algo"
)

// Backend is the shared store behind a Cache: the Redis store in the
// daemon. Its methods bound their own time (the store's timeout) and are
// safe for concurrent use.
type Backend interface {
	// Take decides cost for key at the store, as policy.Store's Take. The
	// cache uses it for peeks it cannot answer locally.
	Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error)
	// Refund gives back cost units taken at takenAt, as policy.Store's.
	Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error
	// TakeLease decides costs for key in order, admitting the longest
	// prefix that fits, and when all are admitted leases up to want more
	// units, in one atomic call. It returns how many costs were admitted,
	// the units leased and the Result after them (At: the store's time).
	TakeLease(ctx context.Context, key []byte, p algo.Params, costs []int64, want int64) (admitted int, leased int64, r algo.Result, err error)
	// Sync runs ops (algo.OpPeek, OpLease and OpRefund from the sync
	// loop; OpReset and OpGrant from Do; OpAcquire from the strict
	// acquires of slots) in one pipelined
	// round trip per store node, filling each op's Granted, Result and
	// Err as algo.Apply would. Without a deadline in ctx it bounds the
	// call itself.
	Sync(ctx context.Context, ops []algo.Op) error
}
