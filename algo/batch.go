package algo

// Batch decides costs in order at now, admitting the longest prefix that
// fits: each cost is decided as by Decide (and consumed when allowed)
// before the next, and deciding stops at the first denial. It returns how
// many costs were admitted and one Result for the batch, as the Redis
// scripts in lua/ reply it:
//
//   - Allowed is true when every cost was admitted;
//   - Remaining and Reset are those of the last admitted cost, or of the
//     first denied one when none was admitted (a denial leaves the state
//     as the last admission left it, so both describe the same state);
//   - RetryAfter is that of the first denied cost (Never when it exceeds
//     the capacity), or 0 when every cost was admitted.
//
// costs must not be empty; p must be valid.
func Batch(p Params, s *State, now int64, costs []int64) (admitted int, r Result) {
	if len(costs) == 0 {
		panic("BUG: algo.Batch: no costs")
	}
	for _, cost := range costs {
		d := Decide(p, s, now, cost, false)
		if !d.Allowed {
			if admitted == 0 {
				return 0, d
			}
			r.Allowed, r.RetryAfter = false, d.RetryAfter
			return admitted, r
		}
		admitted++
		r = d
	}
	return admitted, r
}

// Lease grants the largest g ≤ want that a take would allow at now and
// consumes it exactly as Decide(p, s, now, g, false) does: a take of g+1
// at now would have been denied, unless g = want. A want below 1 counts
// as 1.
//
// When g > 0, r is the Result of that take. When nothing fits, g is 0, s
// is left alone and r is the (denied) Result of a take of cost 1, whose
// RetryAfter says when a lease can next grant anything. p must be valid.
func Lease(p Params, s *State, now, want int64) (granted int64, r Result) {
	want = max(want, 1)
	r = Decide(p, s, now, 1, true)
	if !r.Allowed {
		return 0, r
	}
	// Remaining is exact: after a cost of 1, Remaining more units fit.
	granted = min(want, r.Remaining+1)
	r = Decide(p, s, now, granted, false)
	if !r.Allowed {
		panic("BUG: algo.Lease: a grant within Remaining was denied")
	}
	return granted, r
}

// TakeLease decides costs as Batch does and, when every cost was
// admitted and want > 0, then leases up to want units as Lease does, at
// the same now: the call a coalesced batch of checks makes when it also
// wants a lease for the checks that will follow. It returns how many
// costs were admitted, how many units were leased (0 when some cost was
// denied, when want ≤ 0, or when nothing more fits) and one Result, as
// the Redis scripts' takelease op replies it:
//
//   - with a lease granted, the Result of the lease (Allowed, RetryAfter
//     0, Remaining and Reset after the lease);
//   - otherwise the Result of Batch.
//
// costs must not be empty; p must be valid.
func TakeLease(p Params, s *State, now int64, costs []int64, want int64) (admitted int, leased int64, r Result) {
	admitted, r = Batch(p, s, now, costs)
	if admitted < len(costs) || want <= 0 {
		return admitted, 0, r
	}
	g, lr := Lease(p, s, now, want)
	if g == 0 {
		return admitted, 0, r
	}
	return admitted, g, lr
}
