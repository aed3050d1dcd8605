package redisx

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/lua"
)

// scripts holds the script of each algorithm, indexed by algo.Kind. Exec
// sends EVALSHA and, when Redis has lost the script (a restart, SCRIPT
// FLUSH, a failover to a replica that never saw it), EVAL: a NOSCRIPT
// reply means the script did not run, so nothing is applied twice. The
// retryable variants are not used: a timed-out call may have been
// applied, and must not be sent again.
var scripts = func() (s [algo.NumKinds]*rueidis.Lua) {
	for k := range s {
		name := algo.Kind(k).String()
		src, ok := lua.Source(name)
		if !ok {
			panic("BUG: redisx: package lua has no script for " + name)
		}
		s[k] = rueidis.NewLuaScript(src)
	}
	return s
}()

// kindSuffix ends the Redis key of each algorithm, so that a counter
// whose rule changes algorithm starts afresh (as in the embedded store)
// instead of misreading the state the other algorithm left.
var kindSuffix = [algo.NumKinds]string{
	algo.TokenBucket:    ":tb",
	algo.GCRA:           ":gcra",
	algo.SlidingLog:     ":sl",
	algo.SlidingCounter: ":sc",
	algo.FixedWindow:    ":fw",
	algo.Concurrency:    ":cc",
}

// AppendKey appends to dst the Redis key that holds the state of counter
// key under algorithm k: prefix, "{", the counter key's bytes, "}", and a
// suffix naming the algorithm (":tb", ":gcra", ":sl", ":sc", ":fw", ":cc").
// All the state of a counter lives in that one key; the hash tag puts
// every algorithm's key of one counter in one Cluster slot.
func AppendKey(dst []byte, prefix string, key []byte, k algo.Kind) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, '{')
	dst = append(dst, key...)
	dst = append(dst, '}')
	if int(k) < len(kindSuffix) {
		dst = append(dst, kindSuffix[k]...)
	}
	return dst
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
	o := opTake
	if peek {
		o = opPeek
	}
	v, err := s.call(ctx, o, key, p, now, max(cost, 1))
	if err != nil {
		return algo.Result{}, err
	}
	return result(p, v, v[0] == 1), nil
}

// Lease reserves up to want units of key's limit, exactly as if that
// many units had been admitted, and returns how many were granted (0 to
// want) with the Result after them. Unused units go back with Refund.
func (s *Store) Lease(ctx context.Context, key []byte, p algo.Params, want int64) (int64, algo.Result, error) {
	v, err := s.call(ctx, opLease, key, p, time.Time{}, max(want, 1))
	if err != nil {
		return 0, algo.Result{}, err
	}
	return v[0], result(p, v, v[0] > 0), nil
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
	args := make([]int64, 0, 1+len(costs))
	args = append(args, want)
	for _, c := range costs {
		args = append(args, max(c, 1))
	}
	v, err := s.script(ctx, opBatch, "takelease", "takelease", 7, key, p, time.Time{}, args...)
	if err != nil {
		return 0, 0, algo.Result{}, err
	}
	n := int(v[0])
	if v[5] > 0 {
		return n, v[5], result(p, v, true), nil
	}
	return n, 0, result(p, v, n == len(costs)), nil
}

// Refund gives back cost units that Take admitted for key at takenAt
// (the take's Result.At); see algo.Refund. A cost of 0 or less counts
// as 1.
func (s *Store) Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	_, err := s.call(ctx, opRefund, key, p, now, max(cost, 1), takenAt.UnixMicro())
	return err
}

// call runs the script of p.Kind on key with op o and the op's
// arguments (ARGV[6] on), and returns the script's five integers: admitted,
// remaining, reset µs, retry-after µs (−1: never), now µs.
func (s *Store) call(ctx context.Context, o op, key []byte, p algo.Params, now time.Time, opArgs ...int64) ([]int64, error) {
	return s.script(ctx, o, o.String(), scriptOp[o], 5, key, p, now, opArgs...)
}

// script runs the script of p.Kind on key with the script op sop (ARGV[1])
// and its arguments (ARGV[6] on), and returns the script's reply, which
// must be n integers. o is the call's op in metrics, name in errors.
func (s *Store) script(ctx context.Context, o op, name, sop string, n int, key []byte, p algo.Params, now time.Time, opArgs ...int64) ([]int64, error) {
	rkey := string(AppendKey(make([]byte, 0, len(s.prefix)+len(key)+8), s.prefix, key, p.Kind))
	if err := checkParams(p); err != nil {
		return nil, fmt.Errorf("redisx: %s %q: %w", name, rkey, err)
	}
	start := time.Now()
	clock := "0" // the script reads Redis TIME
	if s.callerClock && !now.IsZero() {
		clock = strconv.FormatInt(now.UnixMicro(), 10)
	}
	args := make([]string, 0, 5+len(opArgs))
	args = appendParams(args, sop, p, clock)
	for _, a := range opArgs {
		args = append(args, strconv.FormatInt(a, 10))
	}
	r, err := s.c.exec(ctx, scripts[p.Kind], rkey, args)
	var v []int64
	if err == nil {
		v, err = r.AsIntSlice()
	}
	if err == nil && len(v) != n {
		err = fmt.Errorf("script replied %d integers, want %d", len(v), n)
	}
	o.record(start, err)
	if err != nil {
		return nil, fmt.Errorf("redisx: %s %q: %w", name, rkey, err)
	}
	return v, nil
}

// appendParams appends ARGV[1..5] of a script call to args: the op sop,
// p's limit, period (µs) and burst, and the clock ("0": Redis TIME).
func appendParams(args []string, sop string, p algo.Params, clock string) []string {
	return append(args, sop,
		strconv.FormatInt(p.Limit, 10),
		strconv.FormatInt(p.PeriodMicros(), 10),
		strconv.FormatInt(p.Burst, 10),
		clock)
}

// result maps a script's reply to an algo.Result.
func result(p algo.Params, v []int64, allowed bool) algo.Result {
	r := algo.Result{
		Allowed:    allowed,
		Limit:      p.Capacity(),
		Remaining:  v[1],
		Reset:      time.Duration(v[2]) * time.Microsecond,
		RetryAfter: time.Duration(v[3]) * time.Microsecond,
		At:         v[4],
	}
	if v[3] < 0 {
		r.RetryAfter = algo.Never
	}
	return r
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
