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
	// Sync runs ops in one pipelined round trip per store node, filling
	// each op's Granted, Result and Err.
	Sync(ctx context.Context, ops []Op) error
}

// OpKind is what one Op of a sync does.
type OpKind uint8

// Op kinds.
const (
	// OpPeek decides a cost of N without taking it: a refresh of the
	// key's remaining quota.
	OpPeek OpKind = iota
	// OpLease leases up to N units.
	OpLease
	// OpReturn gives back N leased units taken at TakenAt.
	OpReturn
)

// Op is one call of a sync.
type Op struct {
	Kind   OpKind
	Key    []byte
	Params algo.Params
	// N is the cost (OpPeek), the units wanted (OpLease) or given back
	// (OpReturn).
	N int64
	// TakenAt is when the returned units were leased, in unix µs of the
	// store's clock (the Result.At of the lease).
	TakenAt int64

	// Granted is the number of units an OpLease got.
	Granted int64
	// Result is the key's state after the op.
	Result algo.Result
	// Err is the op's error; the others' fields are then meaningless.
	Err error
}
