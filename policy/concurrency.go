package policy

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/wire"
)

// Errors of Release, wrapped by the Decision's Err.
var (
	// ErrUnknownLease: the lease holds no slot: it was released already,
	// its slots expired (the rule's timeout passed), or its rule is gone
	// or no longer a concurrency rule.
	ErrUnknownLease = errors.New("unknown or expired lease")
	// ErrBadLease: the lease does not parse; it is not one that
	// AcquireTo returned.
	ErrBadLease = errors.New("malformed lease")
)

// leaseVersion is the first byte of an encoded lease.
const leaseVersion = 1

// A lease names the slots an acquire holds, so that any daemon of the
// fleet, this one after a restart included, can release them: nothing of
// it is kept on the daemon. It is the base64url (unpadded) encoding of
//
//	u8       leaseVersion
//	uvarint  cost: the slots held under each rule
//	then per concurrency rule that admitted the acquire:
//	u8       flags: 1 = held in the Fallback's local state
//	uvarint  at: the admission's time, unix µs of its store's clock
//	uvarint  key length, key: the counter key (rule name, 0x00, values)
//
// A lease grants nothing: forging one can only release slots, which a
// caller on the socket could do by never acquiring them.

// AcquireTo decides a request as CheckTo does, and then the concurrency
// rules that apply hold cost slots each until Release or their timeout,
// instead of looking for a free one as a check does. When the request is
// allowed and a concurrency rule applied, it returns the lease to release
// them with (nil otherwise): it aliases sc, and is valid until sc's next
// use. A denial holds nothing.
func (p *Policy) AcquireTo(ctx context.Context, now time.Time, descs []wire.Descriptor, cost int64, sc *Scratch, d *Decision) []byte {
	if sc == nil {
		sc = new(Scratch)
	}
	sc.taken = sc.taken[:0]
	p.check(ctx, now, descs, cost, false, sc, d, false, true)
	return p.lease(ctx, now, cost, sc, d)
}

// TryAcquireTo is AcquireTo when every store the acquire needs answers
// on the host (see TryCheckTo); otherwise it takes nothing and reports
// false.
func (p *Policy) TryAcquireTo(ctx context.Context, now time.Time, descs []wire.Descriptor, cost int64, sc *Scratch, d *Decision) ([]byte, bool) {
	if sc == nil {
		sc = new(Scratch)
	}
	sc.taken = sc.taken[:0]
	if !p.check(ctx, now, descs, cost, false, sc, d, true, true) {
		return nil, false
	}
	return p.lease(ctx, now, cost, sc, d), true
}

// lease encodes the slots that the allowed acquire in sc holds, or
// returns nil when it holds none. A lease that would exceed
// wire.MaxTokenLen releases them and makes d an error.
func (p *Policy) lease(ctx context.Context, now time.Time, cost int64, sc *Scratch, d *Decision) []byte {
	if !d.Status.Allowed() {
		return nil
	}
	cost = max(cost, 1)
	raw := append(sc.leaseRaw[:0], leaseVersion)
	raw = binary.AppendUvarint(raw, uint64(cost))
	n := 0
	for i := range sc.taken {
		t := &sc.taken[i]
		if p.rules[t.rule].paramsAt(int(t.tier)).Kind != algo.Concurrency {
			continue
		}
		var flags byte
		if t.local {
			flags = 1
		}
		raw = append(raw, flags)
		raw = binary.AppendUvarint(raw, uint64(max(t.at, 0)))
		raw = binary.AppendUvarint(raw, uint64(t.end-t.start))
		raw = append(raw, sc.keys[t.start:t.end]...)
		n++
	}
	sc.leaseRaw = raw
	if n == 0 {
		return nil
	}
	size := base64.RawURLEncoding.EncodedLen(len(raw))
	if size > wire.MaxTokenLen {
		p.refund(ctx, now, cost, false, false, sc)
		*d = Decision{Status: StatusError, Code: CodeInternal, Rule: d.Rule,
			Err: fmt.Errorf("policy: acquire: the lease would take %d bytes, more than %d: the by descriptors' values are too long", size, wire.MaxTokenLen)}
		return nil
	}
	sc.lease = base64.RawURLEncoding.AppendEncode(sc.lease[:0], raw)
	return sc.lease
}

// slot is one concurrency slot of a lease.
type slot struct {
	local bool
	at    int64
	key   []byte
}

// parseLease decodes lease into its cost and slots.
func parseLease(lease []byte) (cost int64, slots []slot, err error) {
	raw, err := base64.RawURLEncoding.AppendDecode(nil, lease)
	if err != nil || len(raw) < 2 || raw[0] != leaseVersion {
		return 0, nil, ErrBadLease
	}
	c, n := binary.Uvarint(raw[1:])
	if n <= 0 || c < 1 || c > 1<<32 {
		return 0, nil, ErrBadLease
	}
	b := raw[1+n:]
	for len(b) > 0 {
		if b[0] > 1 {
			return 0, nil, ErrBadLease
		}
		s := slot{local: b[0] == 1}
		at, n := binary.Uvarint(b[1:])
		if n <= 0 || at > 1<<62 {
			return 0, nil, ErrBadLease
		}
		b = b[1+n:]
		kl, n := binary.Uvarint(b)
		if n <= 0 || kl == 0 || kl > uint64(len(b)-n) {
			return 0, nil, ErrBadLease
		}
		s.at, s.key = int64(at), b[n:n+int(kl)]
		b = b[n+int(kl):]
		slots = append(slots, s)
	}
	if len(slots) == 0 {
		return 0, nil, ErrBadLease
	}
	return int64(c), slots, nil
}

// Release gives back the slots of lease, which AcquireTo returned (here
// or on another daemon sharing the store), at now. Its Decision is
// allowed, by the last rule that gave slots back, with that limit's
// numbers after the release; or an error: CodeMalformed for a lease that
// does not parse, CodeNotFound when no slot of it was held any more
// (nothing changed), CodeInternal when a store failed (its slots then
// expire at their timeout).
func (p *Policy) Release(ctx context.Context, now time.Time, lease []byte) Decision {
	cost, slots, err := parseLease(lease)
	if err != nil {
		return Decision{Status: StatusError, Code: CodeMalformed, Err: fmt.Errorf("policy: release: %w", err)}
	}
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx) // a lost release holds slots until their timeout
	}
	var d Decision
	released := 0
	for _, s := range slots {
		r := p.ruleOfKey(s.key)
		if r == nil || r.base.Kind != algo.Concurrency {
			continue // the rule is gone: its slots expire on their own
		}
		params := &r.base
		op := algo.Op{Kind: algo.OpRelease, Key: s.key, Params: *params, N: cost, TakenAt: s.at}
		switch {
		case s.local:
			if p.fallback == nil || !p.fallback.release(&op, now) {
				continue
			}
		default:
			o, ok := r.store.(Operator)
			if !ok {
				return Decision{Status: StatusError, Code: CodeInternal, Rule: r.name,
					Err: fmt.Errorf("policy: release: rule %q: its store cannot release", r.name)}
			}
			ops := [1]algo.Op{op}
			err := o.Do(ctx, ops[:], now)
			if err == nil {
				err = ops[0].Err
			}
			if err != nil {
				r.m.inc(decError)
				return Decision{Status: StatusError, Code: CodeInternal, Rule: r.name, Period: params.Period,
					Err: fmt.Errorf("policy: release: rule %q: %w (its slots expire after %s)", r.name, err, params.Period)}
			}
			op = ops[0]
		}
		if op.Admitted == 0 {
			continue
		}
		released++
		releases.Inc()
		d.set(StatusAllowed, s.local, r.name, &op.Result, params)
	}
	if released == 0 {
		releasesUnknown.Inc()
		return Decision{Status: StatusError, Code: CodeNotFound, Err: fmt.Errorf("policy: release: %w", ErrUnknownLease)}
	}
	return d
}

// ruleOfKey returns the rule whose counter keys start as key does (its
// name, then 0x00), or nil.
func (p *Policy) ruleOfKey(key []byte) *rule {
	for i := range p.rules {
		r := &p.rules[i]
		if len(key) > len(r.prefix) && string(key[:len(r.prefix)]) == string(r.prefix) {
			return r
		}
	}
	return nil
}

// release runs op, an algo.OpRelease, on the local state: the slots an
// acquire took from it while the store was out. It reports false when
// there is no local state.
func (f *Fallback) release(op *algo.Op, now time.Time) bool {
	m := f.mem.Load()
	if m == nil {
		return false
	}
	op.Params = fairShare(op.Params, f.Peers())
	if o, ok := m.LocalStore.(Operator); ok {
		ops := [1]algo.Op{*op}
		if o.Do(context.Background(), ops[:], now) != nil || ops[0].Err != nil {
			return false
		}
		*op = ops[0]
		return true
	}
	return false
}
