// Package lua holds the Redis scripts of rld's algorithms, embedded with
// go:embed; each computes exactly what package algo computes, on integer
// microseconds that stay below 2^53 so that Lua's doubles are exact.
//
// There is one script per algorithm (Names), and Source returns it ready
// for SCRIPT LOAD, EVALSHA or EVAL. Every script follows one calling
// convention:
//
//	KEYS[1]  the counter's key. All state of a counter lives in that key.
//	KEYS[2]  optional, in the same Cluster slot (the same hash tag): the
//	         hash of the units out on lease of the counter, one field per
//	         holder, "<units>:<until µs>" (algo.Op's Holder, State.Out).
//	         With it, ARGV[6..9] are the caller's holder id ("" for
//	         none), the units it spent from its lease since its last call
//	         (algo.Op.Spent), when that lease was taken (SpentAt, µs) and
//	         its leases' lifetime in µs, and the op's own arguments, below
//	         from ARGV[6] on, move four places up (ARGV[10] on). The
//	         script touches no other key, so it is Cluster-safe.
//	ARGV[1]  op: "take", "takelease", "peek", "lease", "refund", "reset",
//	         "grant", "charge", or for concurrency.lua "acquire" and
//	         "release"
//	ARGV[2]  limit L (>= 1)
//	ARGV[3]  period P in µs (>= 1)
//	ARGV[4]  burst: the capacity of token_bucket and gcra; "0" means L.
//	         The window algorithms ignore it.
//	ARGV[5]  now in unix µs; "0" means Redis TIME, which is what rld
//	         sends. An explicit time is for tests only (the differential
//	         test against package algo): it lets a skewed caller move
//	         the limit's clock.
//	take     ARGV[6..] = costs c1..cn (n >= 1). The costs are decided in
//	         order at the same now, each consuming before the next is
//	         decided; the longest prefix of allowed costs is admitted and
//	         deciding stops at the first denial (algo.Batch).
//	takelease
//	         ARGV[6] = want (>= 0), ARGV[7..] = costs c1..cn (n >= 1):
//	         the costs are decided as by take; then, if all of them were
//	         admitted and want > 0, a lease of want as by lease, at the
//	         same now, in the same call (algo.TakeLease).
//	peek     ARGV[6] = cost: decide, consume nothing, write nothing.
//	lease    ARGV[6] = want: grant the largest g <= want that a take would
//	         allow now (0 if none) and consume it as a take of g
//	         (algo.Lease).
//	refund   ARGV[6] = cost, ARGV[7] = takenAt µs (the now_us of the take):
//	         algo.Refund; with a holder, a lease's return, of no more
//	         than the holder has out.
//	reset    ARGV[6] is not read: the key is deleted, a fresh key
//	         (algo.Reset), less the units out on lease when KEYS[2] is
//	         given, taken as by lease.
//	grant    ARGV[6] = n: n units more of the current quota, capped at a
//	         fresh key's (algo.Grant: a refund of n units taken now, or
//	         for sliding_log the oldest live admissions go first).
//	charge   ARGV[6] = n: n units (capped at the capacity) taken whether
//	         they fit or not, up to a debt of one capacity (algo.Charge).
//	release  ARGV[6] = cost, ARGV[7] = the slot's time (the now_us of the
//	         acquire that held it), ARGV[8] = its slot id, optional
//	         (none: an admission of a take): algo.Release, of that
//	         admission alone (concurrency.lua only).
//	acquire  ARGV[6..] = slot ids, 16 lowercase hex digits each, not all
//	         0, unique among the key's admissions (the caller's to
//	         make so): one slot held per id, in order, the longest
//	         prefix that fits, each its own member of the sorted set
//	         (algo.AcquireBatch; concurrency.lua only).
//
// A cost, or the want of lease, below 1 counts as 1; the want of
// takelease must be >= 0, and 0 asks for no lease. Every op but takelease
// replies with an array of five integers {admitted, remaining, reset_us,
// retry_after_us, now_us}; takelease adds a sixth, leased, and a
// seventh, parked:
//
//	take     admitted = how many costs of the prefix were admitted;
//	         remaining and reset_us are those of the last admitted cost
//	         (of the first denied one when none was); retry_after_us is
//	         that of the first denied cost, 0 if all were admitted, -1
//	         (algo.Never) when it exceeds the capacity.
//	takelease
//	         {admitted, remaining, reset_us, retry_after_us, now_us,
//	         leased, parked}: admitted and retry_after_us as take; leased
//	         = units granted by the lease (0 when a cost was denied, want
//	         is 0 or nothing more fits); remaining and reset_us after the
//	         lease when leased > 0, else as take; parked = when a cost was
//	         denied and the call has a holder, the units out on lease,
//	         the caller's own included (else 0).
//	peek     admitted 1 or 0; the rest as algo.Decide with peek.
//	lease    admitted = units granted; remaining and reset_us after the
//	         grant; retry_after_us 0 if any unit was granted, else the
//	         retry-after of a take of cost 1.
//	release  admitted 1 if the admission was in flight and gave its slots
//	         back, else 0 (nothing changed); remaining the slots free
//	         after it, reset_us when the newest held expires.
//	acquire  as take, but now_us is the slots' time (the later of now
//	         and the newest admission's, if the clock stepped back),
//	         which with its id names each slot for its release.
//	charge   admitted 0; remaining, reset_us and retry_after_us of a peek
//	         of cost 1 after the op.
//	refund, reset, grant
//	         admitted 0; remaining and reset_us of a peek of cost 1 after
//	         the op; retry_after_us 0.
//	now_us   the time the script used.
//
// OnceSource returns each script behind once.lua, a guard for the ops of
// a lease's settle: KEYS[2] (in KEYS[1]'s hash slot) records the op, two
// more last ARGV are the mark it records and its life in ms (written
// once the op replied without an error), and an op recorded already
// replies the error "RLDAPPLIED …" (the same mark) or "RLDCONFLICT …"
// (another) and changes nothing.
//
// Every write sets the key's TTL to 2 × max(P, time until the state is
// idle), rounded up to whole milliseconds, so that a key expires only once
// it is equivalent to a missing one; a peek, a denial, or a lease or
// takelease that admits and grants nothing writes nothing. The state
// layouts are described at the top of each script and in
// docs/algorithms.md.
//
// HeartbeatSource returns one more script, heartbeat.lua, not prefixed
// with lib.lua and with a calling convention of its own: the registry of
// live daemons (see its doc comment).
package lua
