package redisx

import (
	"context"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
)

// AppendKey appends to dst the Redis key that holds the state of counter
// key under algorithm k: prefix, "{", the counter key's bytes, "}", and a
// suffix naming the algorithm (its algo.KindInfo.KeySuffix: ":tb",
// ":gcra", ":sl", ":sc", ":fw", ":cc"), so that a counter whose rule
// changes algorithm starts afresh instead of misreading the state the
// other algorithm left.
// All the state of a counter lives in that one key; the hash tag puts
// every algorithm's key of one counter in one Cluster slot.
func AppendKey(dst []byte, prefix string, key []byte, k algo.Kind) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, '{')
	dst = append(dst, key...)
	dst = append(dst, '}')
	return append(dst, k.Info().KeySuffix...)
}

// Store is the Redis implementation of policy.Store: each decision is one
// script call on one key, atomic in Redis and timed by Redis's clock
// (TIME), so every daemon sharing the Redis enforces one limit. It is
// safe for concurrent use. Create it with NewStore.
//
// The scripts give every key they write a TTL (twice the longer of the
// period and the time until the state is back to a fresh key's), so idle
// keys disappear on their own and expiry never changes a decision.
//
// Every call lasts at most the Client's Timeout, or until the deadline of
// its ctx if that comes first (Do, the batch of many ops, until ctx's
// deadline when it has one); the cancellation of ctx is not followed
// (see Client). Calls are never retried: a call that timed out may have
// been applied, and an admission must not be applied twice.
type Store struct {
	c      *Client
	prefix string
	// callerClock makes the scripts use the caller's now instead of Redis
	// TIME. Tests only: hosts' clocks differ, Redis's is the one clock.
	callerClock bool
}

// NewStore returns a Store on c with c's key prefix.
func NewStore(c *Client) *Store {
	return &Store{c: c, prefix: c.o.KeyPrefix}
}

// Take decides whether cost units of the limit p are available for key
// and consumes them when they are and peek is false; see algo.Decide. A
// cost of 0 or less counts as 1. The decision is made at Redis's time
// (returned as Result.At), not at now.
func (s *Store) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	kind := algo.OpTake
	if peek {
		kind = algo.OpPeek
	}
	op, err := s.one(ctx, algo.Op{Kind: kind, Key: key, Params: p, N: max(cost, 1)}, now)
	return op.Result, err
}

// Lease reserves up to want units of key's limit, exactly as if that
// many units had been admitted, and returns how many were granted (0 to
// want) with the Result after them. Unused units go back with Refund.
func (s *Store) Lease(ctx context.Context, key []byte, p algo.Params, want int64) (int64, algo.Result, error) {
	op, err := s.one(ctx, algo.Op{Kind: algo.OpLease, Key: key, Params: p, N: max(want, 1)}, time.Time{})
	return op.Granted, op.Result, err
}

// TakeLease takes costs[0], costs[1], … from key's limit in that order,
// admitting the longest prefix that fits (algo.Batch) and, when every
// cost was admitted and want > 0, then leases up to
// want units as Lease does, in the same call (the scripts' takelease op,
// algo.TakeLease): a coalesced batch of checks that also refills the
// cache's lease costs one round trip. It returns how many costs were
// admitted, how many units were leased (0 when a cost was denied, want is
// 0 or less, or nothing more fits) and the Result: the lease's when units
// were leased, else the batch's: Allowed when all were admitted, and the
// RetryAfter of the first one refused when not. Costs of 0 or less count
// as 1. With want 0 it is the call a coalesced batch of strict checks
// makes.
//
// With no costs, TakeLease is Lease when want > 0 (its Result is then a
// denial, with the RetryAfter of a take of 1, when nothing was granted),
// and admits nothing and returns an allowing Result otherwise.
func (s *Store) TakeLease(ctx context.Context, key []byte, p algo.Params, costs []int64, want int64) (admitted int, leased int64, r algo.Result, err error) {
	want = max(want, 0)
	if len(costs) == 0 {
		if want == 0 {
			return 0, 0, algo.Result{Allowed: true, Limit: p.Capacity()}, nil
		}
		leased, r, err = s.Lease(ctx, key, p, want)
		return 0, leased, r, err
	}
	op, err := s.one(ctx, algo.Op{Kind: algo.OpTakeLease, Key: key, Params: p, N: want, Costs: costs}, time.Time{})
	return op.Admitted, op.Granted, op.Result, err
}

// Refund gives back cost units that Take admitted for key at takenAt
// (the take's Result.At); see algo.Refund. A cost of 0 or less counts
// as 1.
func (s *Store) Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	_, err := s.one(ctx, algo.Op{Kind: algo.OpRefund, Key: key, Params: p, N: max(cost, 1), TakenAt: takenAt.UnixMicro()}, now)
	return err
}

// checkParams rejects Params the scripts cannot compute with. Callers are
// expected to pass Params that passed Params.Validate (policy does); this
// is the cheap guard that keeps a bad caller's call from reaching Redis.
func checkParams(p algo.Params) error {
	if p.Limit <= 0 || p.Period < time.Microsecond || p.Burst < 0 || p.Kind >= algo.NumKinds {
		return fmt.Errorf("invalid limit %+v", p)
	}
	return nil
}
