package region

import (
	"context"
	"math/bits"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/policy"
)

// Store decides a global rule's keys on the region's own store, with the
// rule's limit scaled to the region's share of each key (see Table). It
// wraps the store of the rule's mode, and answers as the inner store
// does, but for the Limit of its Results: the rule's global capacity. It
// implements policy.Operator, and policy.LocalTaker and
// policy.DenialPeeker, passing them through when the inner store has
// them.
//
// A key whose share is 0 (the other regions hold the whole limit) is
// denied without asking the inner store, with a Retry-After of one
// renewal interval: shares are never rounded up to 1, which would let R
// regions admit R units over the bound.
type Store struct {
	r        *Region
	inner    policy.Store
	ops      policy.Operator
	local    policy.LocalTaker
	peeker   policy.DenialPeeker
	base     int64 // the rule's base limit
	fallback int64 // the rule's fallback_share of base; 0: limit / regions
	strict   bool  // a key with no live share renews at once (WrapStrict)
}

// Wrap returns the Store of a global rule whose base limit is base and
// whose fallback_share is fallback (0: the limit divided by the number of
// regions), deciding on inner.
func (r *Region) Wrap(inner policy.Store, base, fallback int64) *Store {
	s := &Store{r: r, inner: inner, base: base, fallback: fallback}
	s.ops, _ = inner.(policy.Operator)
	s.local, _ = inner.(policy.LocalTaker)
	s.peeker, _ = inner.(policy.DenialPeeker)
	return s
}

// WrapStrict returns the Store of a strict global rule (global_strict)
// whose base limit is base, deciding on inner: its fallback share is 0,
// and a take of a key with no live share in the region first renews the
// key on the global store (one round trip, coalesced per key), then
// decides on the share granted. When the global store gives no share
// within two intervals, the take fails with ErrGlobalUnanswered, and the
// rule's fail mode decides (open: on limit / regions, see RegionParams).
func (r *Region) WrapStrict(inner policy.Store, base int64) *Store {
	s := r.Wrap(inner, base, 0)
	s.strict = true
	return s
}

// metaOf returns the renewal meta of a key limited by p.
func (s *Store) metaOf(p *algo.Params) meta {
	m := meta{limit: p.Limit, periodMs: max(p.Period.Milliseconds(), 1)}
	switch {
	case s.strict:
		m.fallback = 0
	case s.fallback > 0 && s.base > 0:
		m.fallback = min(mulDiv(s.fallback, p.Limit, s.base), p.Limit)
	default:
		m.fallback = p.Limit / int64(len(s.r.o.Regions))
	}
	return m
}

// scaled returns p scaled to key's share at now, counting cost as
// demand, and false when the share is 0; and key's table entry (nil:
// none), for refused.
func (s *Store) scaled(key []byte, p *algo.Params, now time.Time, cost int64) (algo.Params, bool, *entry) {
	m := s.metaOf(p)
	units, fell, e := s.r.table.share(key, &m, now, cost)
	if fell && cost > 0 {
		s.r.fellBack()
	}
	q, ok := scale(*p, units)
	return q, ok, e
}

// scale returns p with Limit and Burst scaled to units of p.Limit, and
// false when units is 0.
func scale(p algo.Params, units int64) (algo.Params, bool) {
	if units <= 0 {
		return p, false
	}
	if units >= p.Limit {
		return p, true
	}
	if p.Burst > 0 {
		p.Burst = max(mulDiv(p.Burst, units, p.Limit), 1)
	}
	p.Limit = units
	return p, true
}

// mulDiv returns a×b/c rounded down, for non-negative a, b and positive c,
// without overflow (the result must fit).
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return a // cannot happen for b ≤ c; keep a, the unscaled value
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}

// denied is the answer for a key whose share is 0.
func (s *Store) denied(p *algo.Params, now time.Time) algo.Result {
	return algo.Result{Limit: p.Capacity(), Reset: s.r.o.Interval, RetryAfter: s.r.o.Interval, At: now.UnixMicro()}
}

// Take decides on the inner store with p scaled to key's share. A strict
// rule's key with no live share gets one from the global store first.
func (s *Store) Take(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, error) {
	if s.strict && !peek && !s.r.table.live(key, p.Limit, now) {
		m := s.metaOf(&p)
		if err := s.r.strictShare(ctx, key, &m, max(cost, 1)); err != nil {
			return algo.Result{}, err
		}
	}
	q, ok, e := s.scaled(key, &p, now, demandOf(cost, peek))
	if !ok {
		if !peek {
			s.refused(e, now)
		}
		return s.denied(&p, now), nil
	}
	res, err := s.inner.Take(ctx, key, q, cost, now, peek)
	if err == nil && !res.Allowed && !peek {
		s.refused(e, now)
	}
	res.Limit = p.Capacity()
	return res, err
}

// refused asks the region's renewer for an early renewal of the key of
// entry e (nil: none), refused at now under its live share (at most once
// per key per askGap).
func (s *Store) refused(e *entry, now time.Time) {
	if e.refused(now, s.r.askGap()) {
		s.r.nudgeAsks()
	}
}

// demandOf is the demand a take of cost counts: none for a peek.
func demandOf(cost int64, peek bool) int64 {
	if peek {
		return 0
	}
	return max(cost, 1)
}

// Refund gives cost back on the inner store, with p scaled as a take
// would scale it now.
func (s *Store) Refund(ctx context.Context, key []byte, p algo.Params, cost int64, takenAt, now time.Time) error {
	q, ok, _ := s.scaled(key, &p, now, 0)
	if !ok {
		return nil // a share of 0 admitted nothing since it was granted
	}
	return s.inner.Refund(ctx, key, q, cost, takenAt, now)
}

// TakeLocal decides on the inner store's host state, when it has one.
func (s *Store) TakeLocal(key []byte, p algo.Params, cost int64, now time.Time, peek bool) (algo.Result, bool) {
	if s.local == nil || s.strict && !peek && !s.r.table.live(key, p.Limit, now) {
		return algo.Result{}, false // Take renews a strict key first
	}
	q, ok, e := s.scaled(key, &p, now, 0)
	if !ok {
		if !peek {
			m := s.metaOf(&p)
			s.r.table.share(key, &m, now, max(cost, 1))
			s.refused(e, now)
		}
		return s.denied(&p, now), true
	}
	res, done := s.local.TakeLocal(key, q, cost, now, peek)
	if done && !peek {
		s.scaled(key, &p, now, max(cost, 1))
		if !res.Allowed {
			s.refused(e, now)
		}
	}
	res.Limit = p.Capacity()
	return res, done
}

// PeekForDenial peeks on the inner store as Take with peek would.
func (s *Store) PeekForDenial(ctx context.Context, key []byte, p algo.Params, cost int64, now time.Time, retryAfter time.Duration) (algo.Result, error) {
	if s.peeker == nil {
		return s.Take(ctx, key, p, cost, now, true)
	}
	q, ok, _ := s.scaled(key, &p, now, 0)
	if !ok {
		return s.denied(&p, now), nil
	}
	res, err := s.peeker.PeekForDenial(ctx, key, q, cost, now, retryAfter)
	res.Limit = p.Capacity()
	return res, err
}

// ExplainRegion implements policy.RegionExplainer: key's share in this
// region, counting no demand.
func (s *Store) ExplainRegion(key []byte, p algo.Params, now time.Time) policy.RegionShare {
	m := s.metaOf(&p)
	rs := policy.RegionShare{Region: s.r.o.Region, Limit: p.Limit, Fallback: m.fallback, Units: m.fallback, Strict: s.strict}
	if sh, ok := s.r.table.Get(key, p.Limit, now); sh.Limit != 0 {
		rs.Live, rs.Expiry, rs.Demand = ok, sh.Expiry, sh.Demand
		if ok {
			rs.Units = sh.Units
		}
	}
	return rs
}

// RegionParams implements policy.RegionScaler: p scaled to key's share at
// now, counting no demand. A share of 0 (lowered since the store was
// called) gives the least limit, 1 unit. A strict rule's key with no
// live share (the global store gave none in time) gets limit / regions,
// the share a non-strict rule falls back to.
func (s *Store) RegionParams(key []byte, p algo.Params, now time.Time) algo.Params {
	m := s.metaOf(&p)
	units, fell, _ := s.r.table.share(key, &m, now, 0)
	if fell && s.strict {
		units = p.Limit / int64(len(s.r.o.Regions))
	}
	q, _ := scale(p, max(units, 1))
	return q
}

// Do runs ops on the inner store (policy.Operator, which every rule's
// store has), each op's Params scaled to its key's share as a take would
// scale them now: a settle's refund or charge, a reset or a grant of a
// global key acts on the region's counter under the region's limit. An
// op of a key whose share is 0 runs under the unscaled limit: its
// counter admits nothing while the share is 0 (Take denies without it).
func (s *Store) Do(ctx context.Context, ops []algo.Op, now time.Time) error {
	for i := range ops {
		if q, ok, _ := s.scaled(ops[i].Key, &ops[i].Params, now, 0); ok {
			ops[i].Params = q
		}
	}
	return s.ops.Do(ctx, ops, now)
}
