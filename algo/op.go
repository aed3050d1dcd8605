package algo

import (
	"errors"
	"strconv"
	"time"
)

// Errors of an op with a Once id, from a store that keeps a record of
// ids (the Redis store): it ran nothing.
var (
	// ErrApplied: an op of the same Key, Once and OnceMark was applied
	// already.
	ErrApplied = errors.New("applied already")
	// ErrOnceConflict: an op of the same Key and Once but another
	// OnceMark was applied already.
	ErrOnceConflict = errors.New("applied already, otherwise")
)

// OpKind is what one Op does to a key's state. It is the one vocabulary
// of store operations: memstore runs ops with Apply, the Redis scripts
// in lua/ implement each kind as their ARGV[1] op (the lua package's
// differential tests hold them to Apply), and the Redis store, the
// hot-key cache and the test stores pass batches of them.
type OpKind uint8

// The kinds of Op. A new kind is added here, to the op table (optable.go),
// to Apply, and to the scripts.
const (
	// OpTake decides a cost of N (at least 1) and consumes it when it
	// fits.
	OpTake OpKind = iota
	// OpPeek decides a cost of N and consumes nothing.
	OpPeek
	// OpLease leases up to N units (at least 1), exactly as if that many
	// had been taken: see Lease. Granted is set.
	OpLease
	// OpTakeLease takes Costs in order as Batch does and, when all fit,
	// leases up to N more units: see TakeLease. Admitted and Granted are
	// set.
	OpTakeLease
	// OpRefund gives back N units (at least 1) taken at TakenAt: see
	// Refund. Its Result is that of a peek of cost 1 after it, with
	// Allowed false and RetryAfter 0. A lease's unused units go back
	// this way.
	OpRefund
	// OpReset clears the key's state: it is a fresh key again (see
	// Reset), less the units the holders still have out on lease
	// (State.Out), taken from it as a lease would take them: the fleet
	// admits no more than a fresh key's bound, and their returns give
	// them back. Its Result is that of a peek of cost 1 after it, with
	// Allowed false and RetryAfter 0. N is not read.
	OpReset
	// OpGrant adds N units (at least 1) to the key's current quota,
	// capped as the algorithm defines: see Grant. Its Result is that of
	// a peek of cost 1 after it, with Allowed false and RetryAfter 0.
	OpGrant
	// OpCharge consumes N units (1 to the capacity) whether they fit or
	// not, as a settle whose cost exceeded its estimate does: see Charge.
	// Its Result is that of a peek of cost 1 after it, with Allowed false
	// (its RetryAfter says when a unit fits again).
	OpCharge
	// OpRelease gives back N units (at least 1) of the Concurrency
	// admission named TakenAt and Slot: see Release. Admitted is 1 when
	// the admission held units at the op's time, else 0 and nothing
	// changed. Its Result is what the key holds after it (the slots free
	// and when the newest expires), with Allowed false and RetryAfter 0.
	OpRelease
	// OpAcquire holds one slot of a Concurrency limit per id of Slots,
	// in order, the longest prefix that fits: see AcquireBatch. Admitted
	// is how many were held; Result.At is their time, which with each id
	// names the slot for its release.
	OpAcquire
	// NumOpKinds is the number of kinds: tables indexed by OpKind are
	// this long.
	NumOpKinds
)

// String returns the op's name, as the scripts' ARGV[1] spells it.
func (k OpKind) String() string {
	if k < NumOpKinds {
		return opTable[k].Name
	}
	return "OpKind(" + strconv.Itoa(int(k)) + ")"
}

// Op is one operation on one key. The caller sets Kind, Key, Params, N
// and, as the kind needs, Costs and TakenAt; whoever runs it (Apply, a
// store's batch) sets Admitted, Granted, Result and Err.
type Op struct {
	// Kind is what the op does.
	Kind OpKind
	// Key is the counter key; Apply does not read it.
	Key []byte
	// Params is the limit of the key.
	Params Params
	// N is the cost of an OpTake or OpPeek, the units wanted by an
	// OpLease or OpTakeLease, the units an OpRefund gives back or the
	// units an OpGrant adds.
	N int64
	// Costs are the costs of an OpTakeLease, in arrival order.
	Costs []int64
	// TakenAt is, for OpRefund, when the units were taken: unix µs on
	// the store's clock (the Result.At of the take or lease); for
	// OpRelease, the admission's time (its Result.At).
	TakenAt int64
	// Slot is, for OpRelease, the id of the slot to release (see
	// Acquire); 0 for an admission that Decide made.
	Slot uint64
	// Slots are the ids of the slots an OpAcquire holds, one each: not
	// 0, and unique among the key's admissions.
	Slots []uint64
	// Once, when not 0, names the op so that it is applied to its key
	// at most once: a store that keeps a record of ids (the Redis store,
	// fleet-wide, for OnceFor µs) records OnceMark under it, and runs a
	// later op of the same Key and Once as nothing, its Err set to
	// ErrApplied (the same OnceMark) or ErrOnceConflict (another). A
	// lease's settle sends its ops so, marked with the actual cost, so
	// that settling one lease through two daemons charges it once.
	// Apply does not read it, nor does memstore: an embedded daemon keeps
	// its own record (policy).
	Once uint64
	// OnceMark is what the record of Once holds: ops of one Once with
	// another mark conflict.
	OnceMark int64
	// OnceFor is how long, in µs (at least 1 ms), the record of Once is
	// kept.
	OnceFor int64

	// Holder, when set, names the lease holder (a daemon) that sends
	// the op, and makes the store keep the units it has out on lease of
	// the key (State.Out): an OpLease or OpTakeLease adds what it
	// grants, until LeaseLife after it (no later than the window's end
	// for FixedWindow and SlidingCounter); an OpRefund is the return of
	// leased units and gives back no more than the holder has out; an
	// op that denies a cost reports in Parked the units out on lease.
	// See docs/cache.md.
	Holder string
	// Spent is the units Holder admitted from its lease of the key since
	// its last op on it (negative when it took more back, with local
	// refunds, than it admitted): they leave its units out before the
	// op runs.
	Spent int64
	// SpentAt is when the lease the Spent units came from was taken
	// (its Result.At): units of a fixed window's or sliding counter's
	// lease that no longer counts (see LeaseCounts) leave nothing.
	SpentAt int64
	// LeaseLife is how long after a grant the holder's units count as
	// out, when Holder is set.
	LeaseLife time.Duration

	// Admitted is, for OpTakeLease, how many of Costs were admitted;
	// for OpAcquire, how many of Slots were held; for OpRelease, 1 when
	// an admission was released, else 0.
	Admitted int
	// Granted is the units an OpLease or OpTakeLease leased.
	Granted int64
	// Parked is, for an OpTakeLease that denied a cost and has a Holder,
	// the units out on lease of the key, the holder's own included (a
	// return of them may be on its way): quota that the denial may owe
	// to leases (0 otherwise).
	Parked int64
	// Result is the key's state after the op (Result.At: the store's
	// time), when Err is nil.
	Result Result
	// Err is the op's error; the other outcomes are then meaningless.
	Err error
}

// Apply runs op on the state s of its key at now (unix µs, the store's
// clock), setting its outcomes; Key and Err are left alone. It is the
// executable specification of every OpKind. op.Params must be valid, an
// OpTakeLease must have Costs, and an OpAcquire Slots.
func Apply(op *Op, s *State, now int64) {
	p := op.Params
	op.Parked = 0
	var total int64 // the units out on lease, when accounted
	if op.Holder != "" || op.Kind == OpReset {
		total = applyHeld(op, s, now)
	}
	switch op.Kind {
	case OpTake, OpPeek:
		DecideTo(p, s, now, op.N, op.Kind == OpPeek, &op.Result)
	case OpLease:
		op.Granted, op.Result = Lease(p, s, now, op.N)
		held(op, s, now)
	case OpTakeLease:
		op.Admitted, op.Granted, op.Result = TakeLease(p, s, now, op.Costs, op.N)
		held(op, s, now)
		if op.Admitted < len(op.Costs) {
			op.Parked = parked(op, s, total)
		}
	case OpRefund:
		if op.Holder == "" {
			Refund(p, s, now, op.TakenAt, op.N)
		} else if n := min(max(op.N, 1), outOwn(s, op.Holder)); n > 0 && LeaseCounts(p, now, op.TakenAt) {
			// A lease's return: no more than the holder has out.
			outAdd(s, op.Holder, -n, 0)
			Refund(p, s, now, op.TakenAt, n)
		}
		after(op, s, now)
	case OpReset:
		out := s.Out
		Reset(s)
		s.Out = out
		if total > 0 {
			Lease(p, s, now, total)
		}
		after(op, s, now)
	case OpGrant:
		Grant(p, s, now, op.N)
		after(op, s, now)
	case OpCharge:
		Charge(p, s, now, op.N)
		DecideTo(p, s, now, 1, true, &op.Result)
		op.Result.Allowed = false
	case OpRelease:
		op.Admitted = 0
		if Release(p, s, now, op.TakenAt, op.Slot, op.N) {
			op.Admitted = 1
		}
		freed(op, s, now)
	case OpAcquire:
		op.Admitted, op.Result = AcquireBatch(p, s, now, op.Slots)
	default:
		panic("BUG: algo.Apply: unknown " + op.Kind.String())
	}
}

// held adds the units op granted to its holder's units out.
func held(op *Op, s *State, now int64) {
	if op.Holder != "" && op.Granted > 0 {
		outAdd(s, op.Holder, op.Granted, LeaseUntil(op.Params, now, op.LeaseLife))
	}
}

// parked returns the units out on lease, total, when op has a Holder:
// the holder's own count too, since it asks only when its lease does not
// cover the cost, and a return of its own may be on its way.
func parked(op *Op, s *State, total int64) int64 {
	if op.Holder == "" {
		return 0
	}
	return total
}

// freed sets op's Result to what the log s holds at now after a release:
// Remaining the units free (the limit less the live entries' costs), Reset
// when the newest live entry expires (0 with none), Allowed false and
// RetryAfter 0. Unlike after's peek, it counts no unit as taken.
func freed(op *Op, s *State, now int64) {
	p := op.Params
	per := p.PeriodMicros()
	var sum, newest int64
	for _, en := range s.Log {
		if en.At > now-per {
			sum += en.Cost
			newest = max(newest, en.At)
		}
	}
	op.Result = Result{Limit: p.Limit, Remaining: max(p.Limit-sum, 0), At: now}
	if sum > 0 {
		op.Result.Reset = micros(newest + per - now)
	}
}

// after sets op's Result to that of a peek of cost 1 on s at now, with
// Allowed false and RetryAfter 0: the reply of the ops that change a
// key's state without deciding anything (refund, reset, grant).
func after(op *Op, s *State, now int64) {
	DecideTo(op.Params, s, now, 1, true, &op.Result)
	op.Result.Allowed, op.Result.RetryAfter = false, 0
}
