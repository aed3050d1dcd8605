// Package algo implements rld's rate-limiting algorithms as pure state
// transitions on integer state, with the clock passed in by the caller.
//
// Every algorithm is defined on integer microseconds so that the Go code and
// the Redis scripts in lua/ compute identical answers; docs/algorithms.md
// gives the exact formulas.
//
// # Operations
//
// Every store speaks one vocabulary: an Op (take, peek, lease, take-lease,
// refund, reset, grant, charge, release) on one key, and Apply, which runs it on an algorithm's State and
// is its specification. memstore decides with the same functions, the Redis
// scripts implement each OpKind as their ARGV[1] op (the lua package's
// differential tests hold them to Apply), the Redis store (redisx) takes a
// batch of Ops, and the hot-key cache (shardcache) sends its syncs as one.
//
// # The tables
//
// What a store needs to know of an op or an algorithm is data: the op
// table (OpKind.Info: its name, the script arguments it sends, its
// reply, whether it is a take, a peek, a lease, a release, clears a key,
// may carry a Once id …) and the algorithm table (Kind.Info: its name,
// its store key suffix, how the hot-key cache's leases of it end,
// whether its admissions are slots). memstore, shardcache and redisx
// consult them and switch on no kind (the test TestStoresUseTheTables
// holds them to it), and Op.Check, Op.CheckOnce and Op.SetReply are the
// one check and the one reading of a script's reply that they share.
//
// # How to add an operation
//
//  1. algo/op.go: a new OpKind (before NumOpKinds), its fields' meaning
//     on Op, and its case in Apply, built from the algorithm functions;
//     its row in the op table (optable.go); a test in op_test.go.
//  2. lua/*.lua: the op in each algorithm's script (ARGV as its Args say,
//     the reply as its Reply, Count and Verdict say), and a timeline of
//     it in lua/lua_test.go (the runner applies it with Apply and in
//     Redis).
//  3. The callers that send it: shardcache when the cache sends it,
//     policy for a decision step that needs it, and the daemon's faces
//     (socket, HTTP, admin). The stores run it as the table says.
//
// # How to add an algorithm
//
//  1. algo: a Kind (at the end: Kinds are stored in Redis key names and
//     metrics), its row in the algorithm table (optable.go: name, key
//     suffix, how leases of it end), its functions in a file of its own
//     (decide, refund, and how it lays out State), their cases in
//     DecideTo, Refund and Idle, and property tests (property_test.go).
//  2. docs/algorithms.md: the formulas, in integer µs.
//  3. lua/<name>.lua: the script, every op, exact as in Go; the lua
//     package's timelines and random differential test cover it once the
//     Kind is in their list.
//
// config accepts its name (ParseKind reads the table), redisx loads its
// script by name (lua.Source) and keys it by its suffix, and memstore
// and shardcache run it as the tables say.
package algo

import (
	"fmt"
	"strings"
	"time"
)

// Kind names an algorithm.
type Kind uint8

// The algorithms. The zero Kind is TokenBucket, the default.
const (
	TokenBucket Kind = iota
	GCRA
	SlidingLog
	SlidingCounter
	FixedWindow
	// Concurrency limits the units in flight: each admission holds its
	// units (slots) until it is released (Release) or its Period, the
	// rule's timeout, has passed.
	Concurrency
	// NumKinds is the number of Kinds: tables indexed by Kind are this
	// long.
	NumKinds
)

// String returns the configuration name of k, such as "token_bucket".
func (k Kind) String() string {
	if k < NumKinds {
		return kindTable[k].Name
	}
	return fmt.Sprintf("algo.Kind(%d)", uint8(k))
}

// ParseKind returns the Kind whose configuration name is s.
func ParseKind(s string) (Kind, error) {
	for k, in := range kindTable {
		if in.Name == s {
			return Kind(k), nil
		}
	}
	names := make([]string, len(kindTable)-1)
	for k, in := range kindTable[:len(kindTable)-1] {
		names[k] = in.Name
	}
	return 0, fmt.Errorf("unknown algorithm %q (want %s or %s)", s, strings.Join(names, ", "), kindTable[len(kindTable)-1].Name)
}

// MaxScaled bounds Limit×Period (in microseconds) and Burst×Period: every
// intermediate value of every algorithm stays below 2^53, so the Lua
// scripts, whose numbers are doubles, compute exactly what Go computes.
const MaxScaled = 1 << 53

// Params describes one limit: Limit units per Period, with a capacity of
// Burst units for TokenBucket and GCRA (Burst 0 means Burst = Limit). For
// Concurrency, Limit is the units in flight at once and Period the time
// after which an admission not released expires (the rule's timeout).
type Params struct {
	Kind   Kind
	Limit  int64
	Period time.Duration
	Burst  int64
}

// Capacity returns the most units the limit can admit at once: Burst for
// TokenBucket and GCRA when set, Limit otherwise.
func (p Params) Capacity() int64 {
	if (p.Kind == TokenBucket || p.Kind == GCRA) && p.Burst > 0 {
		return p.Burst
	}
	return p.Limit
}

// PeriodMicros returns Period in whole microseconds.
func (p Params) PeriodMicros() int64 { return p.Period.Microseconds() }

// Validate reports whether p describes a limit the algorithms can enforce
// exactly.
func (p Params) Validate() error {
	if p.Kind >= NumKinds {
		return fmt.Errorf("unknown algorithm %d", p.Kind)
	}
	if p.Limit <= 0 {
		return fmt.Errorf("limit must be positive, got %d", p.Limit)
	}
	if p.Period < time.Millisecond {
		return fmt.Errorf("period must be at least 1ms, got %s", p.Period)
	}
	if p.Burst < 0 {
		return fmt.Errorf("burst must not be negative, got %d", p.Burst)
	}
	per := p.PeriodMicros()
	if p.Limit > MaxScaled/per || p.Capacity() > MaxScaled/per {
		return fmt.Errorf("limit×period too large for exact arithmetic (limit %d, burst %d, period %s)", p.Limit, p.Burst, p.Period)
	}
	return nil
}

// Never is the RetryAfter of a request whose cost exceeds the capacity of
// its limit: it can never be admitted, however long the caller waits.
const Never time.Duration = -1

// Result is the outcome of one decision.
type Result struct {
	// Allowed reports whether the cost was admitted (and consumed, unless
	// the call was a peek).
	Allowed bool
	// Limit is the limit's capacity, as reported to clients.
	Limit int64
	// Remaining is how many units could still be admitted right now,
	// after this decision.
	Remaining int64
	// Reset is how long until the limit is fully replenished (or the
	// window ends), with no further traffic.
	Reset time.Duration
	// RetryAfter is 0 when allowed; when denied, how long until the same
	// cost would be admitted, or Never.
	RetryAfter time.Duration
	// At is the time the decision was made, in unix microseconds of the
	// store's clock (Redis TIME for the Redis store). A refund of this
	// take passes it back as takenAt.
	At int64
}
