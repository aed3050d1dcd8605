package policy

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/wire"
)

// Errors of Release and Settle, wrapped by the Decision's Err.
var (
	// ErrUnknownLease: the lease holds nothing any more: it was released
	// or settled already, its slots expired (the rule's timeout passed),
	// it is older than MaxLeaseAge, its rules are gone, or it was not
	// signed with this fleet's lease key.
	ErrUnknownLease = errors.New("unknown or expired lease")
	// ErrBadLease: the lease does not parse; it is not one that
	// AcquireTo returned.
	ErrBadLease = errors.New("malformed lease")
)

// MaxLeaseAge is how long after its acquire a lease may be settled: a
// later Settle is refused (ErrUnknownLease) and changes nothing. A daemon
// remembers each lease it settled this long (8 bytes and a map entry),
// and Redis as long (a small key per counter a settle corrected), to
// refuse a second settle of it.
const MaxLeaseAge = 10 * time.Minute

// leaseVersion is the first byte of an encoded lease. A lease of
// another version (one that names its slots by time alone, from a daemon
// before slot ids) does not parse: it is malformed, and changes nothing.
const leaseVersion = 3

// leaseEncoding reads leases: strict, so that one lease has one spelling.
var leaseEncoding = base64.RawURLEncoding.Strict()

// leaseTag is the length of a lease's signature: HMAC-SHA256, truncated.
const leaseTag = 16

// Entry flags of a lease.
const (
	entryLocal = 1 << iota // held in the Fallback's local state
	entryTake              // a rate rule's units, to settle; else concurrency slots
)

// A lease names what an acquire took, so that any daemon of the fleet
// with its lease key (this one after a restart included, with
// store.lease_key_file) can release or settle it: nothing of it is kept
// on the daemon. It is the base64url (unpadded) encoding of
//
//	u8       leaseVersion
//	uvarint  cost: the units taken under each rate rule: the estimate
//	uvarint  issued: unix µs of the daemon's clock, for MaxLeaseAge
//	8 bytes  nonce: tells apart the leases of like acquires at one µs
//	then per rule that took something:
//	u8       flags: entryLocal, entryTake
//	uvarint  at: the decision's time, unix µs of its store's clock
//	entryTake only: u8 algo.Kind, uvarint limit, uvarint period µs,
//	         uvarint burst: the limit the units were taken from
//	else (a concurrency slot): 8 bytes, big-endian: the slot's id
//	         (nextSlot), 0 for a store that holds no slot by id
//	uvarint  key length, key: the counter key (rule name, 0x00, values)
//	16 bytes HMAC-SHA256 of all the above, under Stores.LeaseKey
//
// The signature keeps a client from releasing or settling what it never
// took: a forged lease could otherwise free any slot, or refund any key.
// Release and Settle verify it alike, and a lease whose signature does
// not hold changes nothing (ErrUnknownLease). The daemons of a fleet
// share the key (store.lease_key_file) to take each other's leases;
// without it each daemon signs with a random key of its own, and a lease
// is released or settled only through the daemon that issued it, before
// it restarts (elsewhere, its slots are held until their timeout).
//
// A slot is named by its time and its id, which the store holds as the
// slot's own entry: a release frees that slot once and no other, however
// many acquires its store answered at one µs. A lease is settled once:
// each correction a settle sends carries the lease's identity (the start
// of its signature) as its algo.Op.Once, marked with the actual cost,
// which the Redis store records beside the counter, atomically with the
// correction, so that settling one lease through two daemons of a fleet
// charges it once and refuses the second ("settled already"); a daemon
// also keeps its own record (Leases, shared by its Policies), the only
// one of the embedded store.

// Leases is what the Policies of one daemon share about the leases of
// acquires: the key that signs them when Stores.LeaseKey is nil, the
// sequences that number leases and concurrency slots, and the record of
// the leases settled. Create it with NewLeases; it is safe for concurrent
// use.
type Leases struct {
	key   []byte        // random: signs the leases when Stores.LeaseKey is nil
	nonce atomic.Uint64 // numbers the leases, from a random start
	slots atomic.Uint64 // numbers the concurrency slots, from a random start

	// settled remembers the leases settled through these Leases, until
	// MaxLeaseAge after their acquire, so that a second Settle of one
	// is refused rather than charged or refunded twice. (A release
	// needs no record: the slots it frees are gone after it.)
	mu      sync.Mutex       // guards settled and sweep
	settled map[uint64]int64 // lease tag → unix µs until which it is kept
	sweep   int64            // unix µs of the next sweep of settled
}

// NewLeases returns Leases with a random key and sequences that start at
// random, so that two daemons (or one restarted) do not repeat each
// other's numbers.
func NewLeases() *Leases {
	var b [48]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("BUG: policy: no randomness: " + err.Error())
	}
	l := &Leases{key: b[:32], settled: make(map[uint64]int64)}
	l.nonce.Store(binary.BigEndian.Uint64(b[32:40]))
	l.slots.Store(binary.BigEndian.Uint64(b[40:48]))
	return l
}

// nextSlot returns the id of a new slot: never 0, never the same twice
// from l (splitmix64's finalizer, a bijection, of the next count), and as
// unlikely to be another daemon's as two random 64-bit numbers are to
// meet.
func (l *Leases) nextSlot() uint64 {
	for {
		x := l.slots.Add(1)
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		x *= 0x94d049bb133111eb
		x ^= x >> 31
		if x != 0 {
			return x
		}
	}
}

// leaseKey returns the key that signs p's leases.
func (p *Policy) leaseKey() []byte {
	if len(p.stores.LeaseKey) > 0 {
		return p.stores.LeaseKey
	}
	return p.leases.key
}

// AcquireTo decides a request as CheckTo does, and then the concurrency
// rules that apply hold one slot each (whatever the cost, which is the
// rate rules' units) until Release (or Settle) or
// their timeout, instead of looking for a free one as a check does. When
// the request is allowed and a rule took something, it returns the lease
// that names it (nil otherwise): Release gives the slots back, and Settle
// corrects the rate rules' units to the request's actual cost, when cost
// was an estimate. The lease aliases sc and is valid until sc's next use.
// A denial holds nothing.
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

// lease encodes what the allowed acquire in sc took, or returns nil when
// it took nothing. A lease that would exceed wire.MaxTokenLen gives it
// all back and makes d an error.
func (p *Policy) lease(ctx context.Context, now time.Time, cost int64, sc *Scratch, d *Decision) []byte {
	if !d.Status.Allowed() || len(sc.taken) == 0 {
		return nil
	}
	cost = max(cost, 1)
	raw := append(sc.leaseRaw[:0], leaseVersion)
	raw = binary.AppendUvarint(raw, uint64(cost))
	raw = binary.AppendUvarint(raw, uint64(max(now.UnixMicro(), 0)))
	raw = binary.BigEndian.AppendUint64(raw, p.leases.nonce.Add(1))
	for i := range sc.taken {
		t := &sc.taken[i]
		params := p.rules[t.rule].paramsAt(int(t.tier))
		var flags byte
		if t.local {
			flags |= entryLocal
		}
		if params.Kind != algo.Concurrency {
			flags |= entryTake
		}
		raw = append(raw, flags)
		raw = binary.AppendUvarint(raw, uint64(max(t.at, 0)))
		if flags&entryTake != 0 {
			raw = append(raw, byte(params.Kind))
			raw = binary.AppendUvarint(raw, uint64(params.Limit))
			raw = binary.AppendUvarint(raw, uint64(params.PeriodMicros()))
			raw = binary.AppendUvarint(raw, uint64(params.Burst))
		} else {
			raw = binary.BigEndian.AppendUint64(raw, t.slot)
		}
		raw = binary.AppendUvarint(raw, uint64(t.end-t.start))
		raw = append(raw, sc.keys[t.start:t.end]...)
	}
	key := p.leaseKey()
	if sc.mac == nil || !bytes.Equal(sc.macKey, key) {
		sc.mac, sc.macKey = hmac.New(sha256.New, key), key
	} else {
		sc.mac.Reset()
	}
	sc.mac.Write(raw)
	raw = sc.mac.Sum(raw)[:len(raw)+leaseTag]
	sc.leaseRaw = raw
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

// leaseEntry is what one rule of an acquire took.
type leaseEntry struct {
	flags  byte
	at     int64
	params algo.Params // entryTake only
	slot   uint64      // a slot's id (not entryTake)
	key    []byte
}

// parsedLease is a lease, decoded and verified.
type parsedLease struct {
	cost, issued int64
	tag          uint64 // the start of the signature: the lease's identity
	signed       bool   // the signature holds under the key
	entries      []leaseEntry
}

// parseLease decodes lease and verifies its signature under key. A lease
// that does not parse (of another leaseVersion included) is ErrBadLease;
// one whose signature does not hold (another daemon's with another key,
// or forged) is not signed.
func parseLease(lease, key []byte) (parsedLease, error) {
	var pl parsedLease
	raw, err := leaseEncoding.AppendDecode(nil, lease)
	if err != nil || len(raw) < 1+leaseTag || raw[0] != leaseVersion {
		return pl, ErrBadLease
	}
	body, tag := raw[:len(raw)-leaseTag], raw[len(raw)-leaseTag:]
	b := body[1:]
	uv := func(max uint64) (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > max {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	cost, ok1 := uv(1 << 32)
	issued, ok2 := uv(1 << 62)
	if !ok1 || !ok2 || cost < 1 || len(b) < 8 {
		return pl, ErrBadLease
	}
	b = b[8:] // the nonce
	for len(b) > 0 {
		e := leaseEntry{flags: b[0]}
		b = b[1:]
		if e.flags&^(entryLocal|entryTake) != 0 {
			return pl, ErrBadLease
		}
		at, ok := uv(1 << 62)
		if !ok {
			return pl, ErrBadLease
		}
		e.at = int64(at)
		if e.flags&entryTake != 0 {
			if len(b) < 1 {
				return pl, ErrBadLease
			}
			e.params.Kind = algo.Kind(b[0])
			b = b[1:]
			limit, ok1 := uv(algo.MaxScaled)
			per, ok2 := uv(algo.MaxScaled)
			burst, ok3 := uv(algo.MaxScaled)
			if !ok1 || !ok2 || !ok3 {
				return pl, ErrBadLease
			}
			e.params.Limit, e.params.Period, e.params.Burst = int64(limit), time.Duration(per)*time.Microsecond, int64(burst)
		} else {
			if len(b) < 8 {
				return pl, ErrBadLease
			}
			e.slot, b = binary.BigEndian.Uint64(b), b[8:]
		}
		kl, ok := uv(uint64(len(b)))
		if !ok || kl == 0 || kl > uint64(len(b)) {
			return pl, ErrBadLease
		}
		e.key, b = b[:kl], b[kl:]
		pl.entries = append(pl.entries, e)
	}
	if len(pl.entries) == 0 {
		return pl, ErrBadLease
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	pl.signed = hmac.Equal(mac.Sum(nil)[:leaseTag], tag)
	pl.cost, pl.issued, pl.tag = int64(cost), int64(issued), binary.BigEndian.Uint64(tag)
	return pl, nil
}

// markSettled records the lease tag, issued at issued (unix µs), as
// settled at now, and reports false when it was already.
func (l *Leases) markSettled(tag uint64, issued, now int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now >= l.sweep {
		for k, until := range l.settled {
			if until <= now {
				delete(l.settled, k)
			}
		}
		l.sweep = now + time.Minute.Microseconds()
	}
	if _, ok := l.settled[tag]; ok {
		return false
	}
	l.settled[tag] = issued + MaxLeaseAge.Microseconds()
	return true
}

// unmarkSettled forgets that the lease tag was settled.
func (l *Leases) unmarkSettled(tag uint64) {
	l.mu.Lock()
	delete(l.settled, tag)
	l.mu.Unlock()
}

// Release gives back the concurrency slots of lease, which AcquireTo
// returned (here or on another daemon with the same Stores.LeaseKey), at
// now: Settle at the estimate. Each slot is freed once: a second release
// of the lease finds its slots gone (ErrUnknownLease), and frees no
// other lease's. See Settle for its Decision; a lease that
// names no slot (an acquire that only rate rules counted) releases
// nothing and is allowed with no rule, and one whose slots are all gone
// is ErrUnknownLease.
func (p *Policy) Release(ctx context.Context, now time.Time, lease []byte) Decision {
	return p.settle(ctx, now, lease, 0, false)
}

// Settle ends the request that AcquireTo's lease names: its concurrency
// slots go back, and the rate rules' units are corrected from the
// acquire's cost (the estimate) to actual, at least 1: the difference is
// charged (algo.Charge: the key may go into debt, and its checks are then
// refused until it has refilled) or refunded (algo.Refund). Each lease
// is settled once, across a fleet on Redis (see the lease's doc); a
// release after it finds its slots gone.
//
// Its Decision is allowed, by the last rule it changed, with that limit's
// numbers after the change; or an error: CodeMalformed for a lease that
// does not parse, CodeNotFound (ErrUnknownLease) when the lease holds
// nothing any more or is older than MaxLeaseAge (nothing changed),
// CodeInternal when a store failed (what it did not reach stays as the
// acquire left it: slots expire at their timeout).
func (p *Policy) Settle(ctx context.Context, now time.Time, lease []byte, actual int64) Decision {
	return p.settle(ctx, now, lease, max(actual, 1), true)
}

func (p *Policy) settle(ctx context.Context, now time.Time, lease []byte, actual int64, settle bool) Decision {
	what := "release"
	if settle {
		what = "settle"
	}
	pl, err := parseLease(lease, p.leaseKey())
	switch {
	case errors.Is(err, ErrBadLease):
		return Decision{Status: StatusError, Code: CodeMalformed, Err: fmt.Errorf("policy: %s: %w", what, err)}
	case err == nil && !pl.signed:
		// Forged, altered, or signed with another key: a release of it
		// could free another client's slot.
		err = fmt.Errorf("%w: not signed with this daemon's lease key (give the fleet one: store.lease_key_file)", ErrUnknownLease)
	case err == nil && now.UnixMicro()-pl.issued > MaxLeaseAge.Microseconds():
		err = fmt.Errorf("%w: acquired more than %s ago", ErrUnknownLease, MaxLeaseAge)
	case err == nil && settle && !p.leases.markSettled(pl.tag, pl.issued, now.UnixMicro()):
		err = fmt.Errorf("%w: settled already", ErrUnknownLease)
	}
	if err != nil {
		releasesUnknown.Inc()
		return Decision{Status: StatusError, Code: CodeNotFound, Err: fmt.Errorf("policy: %s: %w", what, err)}
	}
	if !settle {
		actual = pl.cost
	}
	slots := 0
	for _, e := range pl.entries {
		if e.flags&entryTake == 0 {
			slots++
		}
	}
	if !settle && slots == 0 {
		// Nothing held: the request is done, as the acquire took it.
		return Decision{Status: StatusAllowed, Rule: RuleNone}
	}
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx) // a lost release holds slots until their timeout
	}
	var d Decision
	changed, applied := 0, 0
	// A settle's ops carry the lease's identity, marked with the actual
	// cost: a store that keeps a record of it (Redis, fleet-wide) applies
	// each entry's correction once. The rate rules' entries go first, in
	// the lease's order, which is every daemon's: of two settles at
	// different costs, the one that records the first entry goes on, and
	// the other finds it recorded otherwise and stops there, having
	// changed nothing. p.leases is this daemon's record, and the
	// embedded store's only one.
	onceFor := max(pl.issued+MaxLeaseAge.Microseconds()-now.UnixMicro(), time.Millisecond.Microseconds())
	for i := range 2 * len(pl.entries) {
		e := pl.entries[i%len(pl.entries)]
		if (e.flags&entryTake != 0) != (i < len(pl.entries)) {
			continue // the rate rules' entries first, then the slots
		}
		r := p.ruleOfKey(e.key)
		if r == nil {
			continue // the rule is gone: its slots expire on their own
		}
		op := algo.Op{Key: e.key, TakenAt: e.at}
		switch {
		case e.flags&entryTake == 0 && r.base.Kind == algo.Concurrency:
			op.Kind, op.Params, op.N, op.Slot = algo.OpRelease, r.slotParams(e.key, now.UnixNano()), 1, e.slot
		case e.flags&entryTake != 0 && actual > pl.cost:
			op.Kind, op.Params, op.N = algo.OpCharge, e.params, actual-pl.cost
		case e.flags&entryTake != 0 && actual < pl.cost:
			op.Kind, op.Params, op.N = algo.OpRefund, e.params, pl.cost-actual
		case e.flags&entryTake != 0 && !settle:
			continue
		case e.flags&entryTake != 0:
			// Nothing to correct; a peek (where the store is
			// shared) records that the lease was settled.
			if e.flags&entryLocal != 0 {
				changed++
				continue
			}
			op.Kind, op.Params, op.N = algo.OpPeek, e.params, 1
		default:
			continue // no longer a concurrency rule
		}
		if op.Params.Validate() != nil {
			continue
		}
		if settle && op.Kind != algo.OpRelease {
			op.Once, op.OnceMark, op.OnceFor = pl.tag, actual, onceFor
		}
		if e.flags&entryLocal != 0 {
			if p.fallback == nil || !p.fallback.do(&op, now) {
				continue
			}
		} else {
			o, ok := r.store.(Operator)
			if !ok {
				return Decision{Status: StatusError, Code: CodeInternal, Rule: r.name,
					Err: fmt.Errorf("policy: %s: rule %q: its store cannot run %s", what, r.name, op.Kind)}
			}
			ops := [1]algo.Op{op}
			err := o.Do(ctx, ops[:], now)
			if err == nil {
				err = ops[0].Err
			}
			if errors.Is(err, algo.ErrApplied) {
				applied++ // settled through another daemon
				continue
			}
			if errors.Is(err, algo.ErrOnceConflict) {
				releasesUnknown.Inc()
				return Decision{Status: StatusError, Code: CodeNotFound,
					Err: fmt.Errorf("policy: %s: %w: settled already, at another cost", what, ErrUnknownLease)}
			}
			if err != nil {
				r.m.inc(decError)
				if settle {
					p.leases.unmarkSettled(pl.tag) // what was not done may be tried again
				}
				return Decision{Status: StatusError, Code: CodeInternal, Rule: r.name, Period: op.Params.Period,
					Err: fmt.Errorf("policy: %s: rule %q: %w", what, r.name, err)}
			}
			op = ops[0]
		}
		if op.Kind == algo.OpRelease && op.Admitted == 0 {
			continue // expired, or released already
		}
		changed++
		switch op.Kind {
		case algo.OpRelease:
			releases.Inc()
		case algo.OpCharge:
			settleCharged.Add(int(op.N))
		case algo.OpRefund:
			settleRefunded.Add(int(op.N))
		}
		// The store's answer is a refusal (algo.Op.Result), a release's
		// with the slots free after it. This answer allows: its next is
		// the limit's own, not a refusal's 0.
		res := op.Result
		res.Allowed, res.RetryAfter = true, 0
		d.set(StatusAllowed, e.flags&entryLocal != 0, r.name, &res, &op.Params)
	}
	if changed == 0 && applied > 0 {
		releasesUnknown.Inc()
		return Decision{Status: StatusError, Code: CodeNotFound, Err: fmt.Errorf("policy: %s: %w: settled already", what, ErrUnknownLease)}
	}
	if changed == 0 {
		releasesUnknown.Inc()
		return Decision{Status: StatusError, Code: CodeNotFound, Err: fmt.Errorf("policy: %s: %w", what, ErrUnknownLease)}
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

// do runs op (a release, charge or refund of a lease) on the local state,
// where the acquire took it while the store was out, at the fair share.
// It reports false when there is no local state.
func (f *Fallback) do(op *algo.Op, now time.Time) bool {
	m := f.mem.Load()
	if m == nil {
		return false
	}
	op.Params = fairShare(op.Params, f.Peers())
	o, ok := m.LocalStore.(Operator)
	if !ok {
		return false
	}
	ops := [1]algo.Op{*op}
	if o.Do(context.Background(), ops[:], now) != nil || ops[0].Err != nil {
		return false
	}
	*op = ops[0]
	return true
}

// slotParams returns the params a release of a slot of r's key answers
// under: the rule's, with the limit of a key override in force (a tier's
// or a glob override's limit needs the request's descriptors, which a
// lease does not carry). The period, the slots' timeout, stays the
// rule's: the release removes a slot taken under it.
func (r *rule) slotParams(key []byte, now int64) algo.Params {
	p := r.base
	p.Limit = r.paramsAt(r.limitIndex(-1, key, nil, now)).Limit
	return p
}
