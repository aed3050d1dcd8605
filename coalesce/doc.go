// Package coalesce batches concurrent calls for one key into one call: at
// most one call is in flight per key, and calls that arrive meanwhile join
// the next batch, each getting its own answer.
//
// A Group runs a RunFunc for batches of requests. The first caller for an
// idle key runs a batch of its one request at once, in its own goroutine.
// Callers that arrive for that key while the call (a "flight") is in progress
// queue for the next batch. When the flight ends, the next batch runs at
// once as one call with all of its requests, in arrival order. Requests
// that arrive later still queue for the batch after that one. A batch holds
// at most Options.MaxBatch requests; a full batch closes and later arrivals
// start another. Different keys do not wait for each other.
//
// rld uses this for strict rules: a burst of checks on one key becomes one
// Redis round trip per flight, not one per check, and a key never has more
// than one call to Redis at a time.
//
// # Not singleflight
//
// golang.org/x/sync/singleflight deduplicates: identical calls made while
// one is in flight share its single result. coalesce batches instead:
//
//   - every request is distinct (checks with different costs, say), and
//     each caller gets its own response, out[i] for reqs[i];
//   - a request that arrives during a flight is never attached to it (that
//     flight may already have computed its answer) but queued for the next
//     one;
//   - a caller whose context ends while its request is still queued is
//     removed from the batch, and the request never runs.
//
// # Contexts
//
// A batch's run gets no caller's context: it must bound its own time
// (rld's Redis layer applies its own timeout). A caller that stops waiting
// because its context ended gets an error wrapping ctx.Err(). If the error
// also wraps ErrNotRun, the request was removed before its batch started
// and was never run. Otherwise its batch was running: the request may have
// been applied, and its response is discarded.
//
// # Panics
//
// A panic in the run function does not crash the process and does not stall
// the key: it is recovered, every caller of the batch gets a *PanicError,
// and the key's next batch runs as usual.
package coalesce
