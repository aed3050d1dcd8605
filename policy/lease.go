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
)

// MaxLeaseLen is the longest lease AcquireTo returns: a client carries it
// back in a RELEASE or SETTLE frame, whose token limit (wire.MaxTokenLen)
// the daemon's tests hold equal to it.
const MaxLeaseLen = 1024

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
// A denial holds nothing. A req that peeks is an error (CodeMalformed,
// ErrAcquirePeek) and takes nothing.
func (p *Policy) AcquireTo(ctx context.Context, req *Request, sc *Scratch, d *Decision) []byte {
	if req.Peek {
		*d = acquirePeek()
		return nil
	}
	if sc == nil {
		sc = new(Scratch)
	}
	sc.taken = sc.taken[:0]
	p.check(ctx, req, sc, d, false, true)
	return p.lease(ctx, req.Now, req.Cost, sc, d)
}

// TryAcquireTo is AcquireTo when every store the acquire needs answers
// on the host (see TryCheckTo); otherwise it takes nothing and reports
// false.
func (p *Policy) TryAcquireTo(ctx context.Context, req *Request, sc *Scratch, d *Decision) ([]byte, bool) {
	if req.Peek {
		*d = acquirePeek()
		return nil, true
	}
	if sc == nil {
		sc = new(Scratch)
	}
	sc.taken = sc.taken[:0]
	if !p.check(ctx, req, sc, d, true, true) {
		return nil, false
	}
	return p.lease(ctx, req.Now, req.Cost, sc, d), true
}

// acquirePeek returns the Decision of an acquire whose Request peeks.
func acquirePeek() Decision {
	return Decision{Status: StatusError, Code: CodeMalformed, Err: fmt.Errorf("policy: acquire: %w", ErrAcquirePeek)}
}

// lease encodes what the allowed acquire in sc took, or returns nil when
// it took nothing. A lease that would exceed MaxLeaseLen gives it
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
	if size > MaxLeaseLen {
		p.refund(ctx, now, cost, false, false, sc)
		*d = Decision{Status: StatusError, Code: CodeInternal, Rule: d.Rule,
			Err: fmt.Errorf("policy: acquire: the lease would take %d bytes, more than %d: the by descriptors' values are too long", size, MaxLeaseLen)}
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
	s := settling{p: p, ctx: ctx, now: now, actual: actual, settle: settle}
	err := s.open(lease)
	if err == nil {
		err = s.apply()
	}
	if err != nil {
		s.d = s.failed(err)
	}
	return s.d
}

// settling is one Release (settle false) or Settle of a lease.
type settling struct {
	p      *Policy
	ctx    context.Context
	now    time.Time
	pl     parsedLease
	actual int64 // the request's actual cost; a release's is the estimate
	settle bool
	// onceFor is how long, µs, a store keeps its record of a settle's
	// corrections (algo.Op.OnceFor): until the lease's MaxLeaseAge.
	onceFor int64
	// changed counts the entries the release or settle changed;
	// applied those a settle through another daemon had applied.
	changed, applied int
	d                Decision // by the last rule changed
}

// ruleError is the failure of a rule's store in a release or settle.
type ruleError struct {
	r      *rule
	period time.Duration
	err    error
}

func (e *ruleError) Error() string { return fmt.Sprintf("rule %q: %v", e.r.name, e.err) }
func (e *ruleError) Unwrap() error { return e.err }

// what names the operation in errors.
func (s *settling) what() string {
	if s.settle {
		return "settle"
	}
	return "release"
}

// open parses and verifies lease into s.pl. A lease that may be settled
// is marked settled here (see markSettled); an error of apply unmarks it.
func (s *settling) open(lease []byte) error {
	pl, err := parseLease(lease, s.p.leaseKey())
	switch {
	case err != nil:
		return err
	case !pl.signed:
		// Forged, altered, or signed with another key: a release of it
		// could free another client's slot.
		return fmt.Errorf("%w: not signed with this daemon's lease key (give the fleet one: store.lease_key_file)", ErrUnknownLease)
	case s.now.UnixMicro()-pl.issued > MaxLeaseAge.Microseconds():
		return fmt.Errorf("%w: acquired more than %s ago", ErrUnknownLease, MaxLeaseAge)
	case s.settle && !s.p.leases.markSettled(pl.tag, pl.issued, s.now.UnixMicro()):
		return fmt.Errorf("%w: settled already", ErrUnknownLease)
	}
	s.pl = pl
	if !s.settle {
		s.actual = pl.cost
	}
	s.onceFor = max(pl.issued+MaxLeaseAge.Microseconds()-s.now.UnixMicro(), time.Millisecond.Microseconds())
	return nil
}

// apply runs the lease's entries: the rate rules' first, in the lease's
// order, which is every daemon's: of two settles at different costs, the
// one that records the first entry goes on, and the other finds it
// recorded otherwise and stops there, having changed nothing. Then the
// concurrency slots. A settle's ops carry the lease's identity, marked
// with the actual cost: a store that keeps a record of it (Redis,
// fleet-wide) applies each entry's correction once; p.leases is this
// daemon's record, and the embedded store's only one.
func (s *settling) apply() error {
	if !s.settle && !s.pl.holdsSlots() {
		// Nothing held: the request is done, as the acquire took it.
		s.d = Decision{Status: StatusAllowed, Rule: RuleNone}
		return nil
	}
	if s.ctx.Done() != nil {
		s.ctx = context.WithoutCancel(s.ctx) // a lost release holds slots until their timeout
	}
	var err error
	for _, takes := range [2]bool{true, false} {
		for i := 0; i < len(s.pl.entries) && err == nil; i++ {
			if e := &s.pl.entries[i]; (e.flags&entryTake != 0) == takes {
				err = s.entry(e)
			}
		}
	}
	switch {
	case err != nil:
		return err
	case s.changed == 0 && s.applied > 0:
		return fmt.Errorf("%w: settled already", ErrUnknownLease)
	case s.changed == 0:
		return ErrUnknownLease
	}
	return nil
}

// holdsSlots reports whether the lease names a concurrency slot.
func (pl *parsedLease) holdsSlots() bool {
	for i := range pl.entries {
		if pl.entries[i].flags&entryTake == 0 {
			return true
		}
	}
	return false
}

// entry runs the op of one entry of the lease, and counts what it
// changed. An entry whose rule is gone or changed kind is skipped: its
// slots expire on their own.
func (s *settling) entry(e *leaseEntry) error {
	r := s.p.ruleOfKey(e.key)
	if r == nil {
		return nil
	}
	op, run := s.entryOp(r, e)
	if !run || op.Params.Validate() != nil {
		return nil
	}
	done, err := s.run(r, e, &op)
	if err != nil || !done || (op.Kind == algo.OpRelease && op.Admitted == 0) {
		return err // expired, or released already
	}
	s.changed++
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
	s.d.set(StatusAllowed, e.flags&entryLocal != 0, r.name, &res, &op.Params)
	return nil
}

// entryOp returns the op of entry e of rule r: a slot's release, or the
// correction of a rate rule's units from the estimate to actual (a peek
// where there is none to make, so that a shared store records the
// settle). It reports false when there is nothing to run.
func (s *settling) entryOp(r *rule, e *leaseEntry) (algo.Op, bool) {
	op := algo.Op{Key: e.key, TakenAt: e.at}
	take, cost := e.flags&entryTake != 0, s.pl.cost
	switch {
	case !take && r.base.Kind == algo.Concurrency:
		op.Kind, op.Params, op.N, op.Slot = algo.OpRelease, r.slotParams(e.key, s.now.UnixNano()), 1, e.slot
	case !take:
		return op, false // no longer a concurrency rule
	case s.actual > cost:
		op.Kind, op.Params, op.N = algo.OpCharge, e.params, s.actual-cost
	case s.actual < cost:
		op.Kind, op.Params, op.N = algo.OpRefund, e.params, cost-s.actual
	case !s.settle:
		return op, false
	case e.flags&entryLocal != 0:
		// Nothing to correct, and no shared store to record it in.
		s.changed++
		return op, false
	default:
		op.Kind, op.Params, op.N = algo.OpPeek, e.params, 1
	}
	if s.settle && op.Kind != algo.OpRelease {
		op.Once, op.OnceMark, op.OnceFor = s.pl.tag, s.actual, s.onceFor
	}
	return op, true
}

// run runs op, of entry e of rule r, where the acquire took it: the
// Fallback's local state or r's store. It reports false when it did not
// run there: no local state, or the correction was applied already by a
// settle through another daemon.
func (s *settling) run(r *rule, e *leaseEntry, op *algo.Op) (bool, error) {
	if e.flags&entryLocal != 0 {
		return s.p.fallback != nil && s.p.fallback.do(op, s.now), nil
	}
	ops := [1]algo.Op{*op}
	err := r.ops.Do(s.ctx, ops[:], s.now)
	if err == nil {
		err = ops[0].Err
	}
	switch {
	case errors.Is(err, algo.ErrApplied):
		s.applied++ // settled through another daemon
		return false, nil
	case errors.Is(err, algo.ErrOnceConflict):
		return false, fmt.Errorf("%w: settled already, at another cost", ErrUnknownLease)
	case err != nil:
		return false, &ruleError{r: r, period: op.Params.Period, err: err}
	}
	*op = ops[0]
	return true, nil
}

// failed returns the Decision of a release or settle that failed with
// err, and counts it: CodeMalformed for a lease that does not parse,
// CodeNotFound for one that holds nothing, CodeInternal for a store's
// failure, after which a settle may be tried again.
func (s *settling) failed(err error) Decision {
	err = fmt.Errorf("policy: %s: %w", s.what(), err)
	var re *ruleError
	switch {
	case errors.Is(err, ErrBadLease):
		return Decision{Status: StatusError, Code: CodeMalformed, Err: err}
	case errors.As(err, &re):
		re.r.m.inc(decError)
		if s.settle {
			s.p.leases.unmarkSettled(s.pl.tag) // what was not done may be tried again
		}
		return Decision{Status: StatusError, Code: CodeInternal, Rule: re.r.name, Period: re.period, Err: err}
	}
	releasesUnknown.Inc()
	return Decision{Status: StatusError, Code: CodeNotFound, Err: err}
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
	ops := [1]algo.Op{*op}
	if m.LocalStore.Do(context.Background(), ops[:], now) != nil || ops[0].Err != nil {
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
