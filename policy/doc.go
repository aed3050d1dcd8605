// Package policy decides requests: it matches descriptors against the
// allow and deny lists and the rules of a configuration, and asks a Store
// for one decision per matched limit. When a shared store fails, a
// Fallback decides by each rule's fail mode: on local state at the
// daemon's fair share (open), or denied (closed).
//
// A Policy is compiled (Compile) from a configuration plus the run-time
// Changes in force, never from a file; a reload or a change compiles a new
// one, and the daemon swaps it in atomically. A Decision's Status and
// Code are policy's own; the daemon writes them on the wire and in HTTP.
//
// The stores a Policy needs are interfaces declared here: Store (memstore,
// the hot-key cache and its strict side), LocalTaker (a store that can
// answer on the host: CheckTo's inline twin TryCheckTo uses it),
// DenialPeeker (cheap peeks for a denial's longer retry-after) and
// LocalStore (the Fallback's local state). Time comes from the caller:
// every check takes its now, and the Fallback's other reads of the time
// go through FallbackOptions.Clock.
package policy
