package algo

import (
	"errors"
	"fmt"
	"slices"
)

// The op table and the algorithm table: what the stores (memstore, the
// hot-key cache, the Redis store) need to know of an OpKind or a Kind to
// check, send, parse and account it, as data. A store consults them and
// does not switch on kinds, so that a new op or algorithm is added here,
// in lua/ and in the docs (see the package doc).

// Arg is one argument of an op's script call, from ARGV[6] on (after the
// lease accounting's, lua's doc.go): which field of Op it sends, and how.
type Arg uint8

// The Args.
const (
	// ArgN sends N, at least 1.
	ArgN Arg = iota + 1
	// ArgWant sends N as is (the op's check keeps it at 0 or more).
	ArgWant
	// ArgTakenAt sends TakenAt.
	ArgTakenAt
	// ArgSlot sends Slot in 16 lowercase hex digits, and nothing when
	// Slot is 0.
	ArgSlot
	// ArgCosts sends each of Costs, at least 1.
	ArgCosts
	// ArgSlots sends each of Slots in 16 lowercase hex digits.
	ArgSlots
)

// Count names the Op field that the first integer of an op's reply (and
// of Apply's outcome) sets.
type Count uint8

// The Counts.
const (
	// CountAllowed: the first integer is 1 when the cost was admitted,
	// and sets no field but Result.Allowed.
	CountAllowed Count = iota
	// CountAdmitted: it is Admitted.
	CountAdmitted
	// CountGranted: it is Granted.
	CountGranted
	// CountNone: it is not read.
	CountNone
)

// Verdict says when an op's Result is Allowed.
type Verdict uint8

// The Verdicts.
const (
	// AllowedNever: the op decides nothing; Allowed is false.
	AllowedNever Verdict = iota
	// AllowedFirst: the reply's first integer is positive.
	AllowedFirst
	// AllowedAll: every item (Costs, Slots) was admitted, or units were
	// granted.
	AllowedAll
)

// OpInfo describes one OpKind.
type OpInfo struct {
	// Name is the op's name: ARGV[1] of the scripts, and its label in
	// the stores' metrics and errors.
	Name string
	// Args are the op's own script arguments, in order (what it reads
	// of Op beyond Params and the lease accounting).
	Args []Arg
	// Reply is how many integers the script replies: 5, and 7 when the
	// reply ends with Granted and Parked (GrantedAt 5, ParkedAt 6).
	Reply int
	// Count is what the reply's first integer sets.
	Count Count
	// Verdict is when the Result is Allowed.
	Verdict Verdict

	// Take: the op decides a cost and consumes it when it fits (take,
	// takelease, acquire).
	Take bool
	// Peek: the op decides a cost and consumes nothing.
	Peek bool
	// Lease: the op grants units (Granted), as if taken.
	Lease bool
	// Release: the op gives units back (a refund, a release).
	Release bool
	// Clears: the op clears the key's state (a store may drop the key);
	// it goes with the lease accounting whether or not it has a Holder,
	// since it leaves the units out on lease out.
	Clears bool
	// Consumes: the op may admit units, and so writes the state of a
	// fresh key (a store creates the key only for such ops).
	Consumes bool
	// Operator: an operator sends the op (reset, grant): it changes a
	// key's quota from outside its traffic.
	Operator bool
	// Settle: a lease's settle or release sends the op (charge, refund,
	// release, and peek, which records a settle at the store's time).
	Settle bool
	// Once: the op may carry a Once id (unless it names a Slot).
	Once bool
	// Slots: the op is of a limit whose admissions are slots (see
	// KindInfo.Slots) only.
	Slots bool
	// NeedN: an N below 1 is invalid rather than counted as 1 (giving
	// back a unit never taken would over-admit).
	NeedN bool
}

// Indexes of the reply integers of an op whose Reply is 7.
const (
	GrantedAt = 5
	ParkedAt  = 6
)

// opTable describes every OpKind.
var opTable = [NumOpKinds]OpInfo{
	OpTake:      {Name: "take", Args: []Arg{ArgN}, Reply: 5, Count: CountAllowed, Verdict: AllowedFirst, Take: true, Consumes: true, Once: true},
	OpPeek:      {Name: "peek", Args: []Arg{ArgN}, Reply: 5, Count: CountAllowed, Verdict: AllowedFirst, Peek: true, Settle: true, Once: true},
	OpLease:     {Name: "lease", Args: []Arg{ArgN}, Reply: 5, Count: CountGranted, Verdict: AllowedFirst, Lease: true, Consumes: true, Once: true},
	OpTakeLease: {Name: "takelease", Args: []Arg{ArgWant, ArgCosts}, Reply: 7, Count: CountAdmitted, Verdict: AllowedAll, Take: true, Lease: true, Consumes: true},
	OpRefund:    {Name: "refund", Args: []Arg{ArgWant, ArgTakenAt}, Reply: 5, Count: CountNone, Release: true, Settle: true, Once: true, NeedN: true},
	OpReset:     {Name: "reset", Args: []Arg{ArgN}, Reply: 5, Count: CountNone, Clears: true, Operator: true, Once: true},
	OpGrant:     {Name: "grant", Args: []Arg{ArgN}, Reply: 5, Count: CountNone, Operator: true, Once: true},
	OpCharge:    {Name: "charge", Args: []Arg{ArgN}, Reply: 5, Count: CountNone, Consumes: true, Settle: true, Once: true},
	OpRelease:   {Name: "release", Args: []Arg{ArgN, ArgTakenAt, ArgSlot}, Reply: 5, Count: CountAdmitted, Release: true, Settle: true, Once: true},
	OpAcquire:   {Name: "acquire", Args: []Arg{ArgSlots}, Reply: 5, Count: CountAdmitted, Verdict: AllowedAll, Take: true, Consumes: true, Slots: true},
}

// noOp describes an OpKind that is not one: no property holds.
var noOp OpInfo

// Info returns the description of k, empty for an unknown k.
func (k OpKind) Info() *OpInfo {
	if k < NumOpKinds {
		return &opTable[k]
	}
	return &noOp
}

// ErrInvalidOp marks an Op that Check rejects: a store runs nothing of it.
var ErrInvalidOp = errors.New("invalid op")

// Check reports whether op can be run as its kind describes: a known
// kind, the Costs or Slots (none 0) its Args read, an N of 1 or more
// when its kind needs one (0 or more for ArgWant), a limit whose
// admissions are slots for an op of slots. Params are not checked.
func (op *Op) Check() error {
	if op.Kind >= NumOpKinds {
		return fmt.Errorf("%w: unknown %s", ErrInvalidOp, op.Kind)
	}
	in := &opTable[op.Kind]
	if in.NeedN && op.N < 1 {
		return fmt.Errorf("%w: %s of %d units", ErrInvalidOp, in.Name, op.N)
	}
	for _, a := range in.Args {
		switch {
		case a == ArgWant && op.N < 0:
			return fmt.Errorf("%w: %s of %d units", ErrInvalidOp, in.Name, op.N)
		case a == ArgCosts && len(op.Costs) == 0:
			return fmt.Errorf("%w: %s of 0 costs", ErrInvalidOp, in.Name)
		case a == ArgSlots && (len(op.Slots) == 0 || slices.Contains(op.Slots, 0)):
			return fmt.Errorf("%w: %s of %d slots (ids not 0)", ErrInvalidOp, in.Name, len(op.Slots))
		}
	}
	if in.Slots && !op.Params.Kind.Info().Slots {
		return fmt.Errorf("%w: %s of a %s limit, want one of slots", ErrInvalidOp, in.Name, op.Params.Kind)
	}
	return nil
}

// CheckOnce is Check for a store that keeps a record of Once ids: an op
// with a Once id must be of a kind that may carry one, and name no Slot.
func (op *Op) CheckOnce() error {
	if err := op.Check(); err != nil || op.Once == 0 {
		return err
	}
	if !opTable[op.Kind].Once || op.Slot != 0 {
		return fmt.Errorf("%w: %s with a once id", ErrInvalidOp, op.Kind)
	}
	return nil
}

// Held reports whether op goes with the lease accounting (a script's
// KEYS[2]): it has a Holder, or its kind clears the key's state.
func (op *Op) Held() bool {
	return op.Holder != "" || opTable[op.Kind].Clears
}

// SetReply sets op's outcomes (Admitted, Granted, Parked, Result) from
// v, its script's reply as its kind's Reply describes ({first, remaining,
// reset µs, retry-after µs (−1: Never), now µs[, granted, parked]}): the
// one reading of every op's reply. v must have Reply integers.
func (op *Op) SetReply(v []int64) {
	in := &opTable[op.Kind]
	switch in.Count {
	case CountAdmitted:
		op.Admitted = int(v[0])
	case CountGranted:
		op.Granted = v[0]
	}
	if in.Reply > GrantedAt {
		op.Granted, op.Parked = v[GrantedAt], v[ParkedAt]
	}
	var allowed bool
	switch in.Verdict {
	case AllowedFirst:
		allowed = v[0] > 0
	case AllowedAll:
		allowed = op.Granted > 0 || op.Admitted == max(len(op.Costs), len(op.Slots))
	}
	op.Result = ReplyResult(op.Params, v, allowed)
}

// ReplyResult returns the Result of a script's reply v (see SetReply)
// for the limit p.
func ReplyResult(p Params, v []int64, allowed bool) Result {
	r := Result{
		Allowed:    allowed,
		Limit:      p.Capacity(),
		Remaining:  v[1],
		Reset:      micros(v[2]),
		RetryAfter: micros(v[3]),
		At:         v[4],
	}
	if v[3] < 0 {
		r.RetryAfter = Never
	}
	return r
}

// Leases says how a lease of a Kind's units (the hot-key cache's, see
// docs/cache.md) relates to its windows.
type Leases uint8

// The Leases.
const (
	// LeaseNone: the cache does not lease the algorithm's units.
	LeaseNone Leases = iota
	// LeaseFree: a lease is tied to no window.
	LeaseFree
	// LeaseWindowReturned: a lease ends with its window, and its unused
	// units go back before the window ends (they weigh on the next
	// window's estimate).
	LeaseWindowReturned
	// LeaseWindowLost: a lease ends with its window, and its unused
	// units are lost with it (no later decision reads them).
	LeaseWindowLost
)

// KindInfo describes one algorithm.
type KindInfo struct {
	// Name is its configuration name, and its script's (lua.Source).
	Name string
	// KeySuffix ends the store key of a counter of the algorithm, so
	// that a counter whose rule changes algorithm starts afresh.
	KeySuffix string
	// Leases is how the cache's leases of its units end.
	Leases Leases
	// Slots: its admissions are slots, each held until released or
	// expired (acquire, release).
	Slots bool
}

// kindTable describes every Kind.
var kindTable = [NumKinds]KindInfo{
	TokenBucket:    {Name: "token_bucket", KeySuffix: ":tb", Leases: LeaseFree},
	GCRA:           {Name: "gcra", KeySuffix: ":gcra", Leases: LeaseFree},
	SlidingLog:     {Name: "sliding_log", KeySuffix: ":sl", Leases: LeaseFree},
	SlidingCounter: {Name: "sliding_counter", KeySuffix: ":sc", Leases: LeaseWindowReturned},
	FixedWindow:    {Name: "fixed_window", KeySuffix: ":fw", Leases: LeaseWindowLost},
	Concurrency:    {Name: "concurrency", KeySuffix: ":cc", Slots: true},
}

// noKind describes a Kind that is not one.
var noKind KindInfo

// Info returns the description of k, empty for an unknown k.
func (k Kind) Info() *KindInfo {
	if k < NumKinds {
		return &kindTable[k]
	}
	return &noKind
}

// Windowed reports whether the leases of k end with its windows.
func (k Kind) Windowed() bool {
	l := k.Info().Leases
	return l == LeaseWindowReturned || l == LeaseWindowLost
}
