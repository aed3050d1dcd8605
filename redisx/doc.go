// Package redisx is rld's Redis client (standalone, Sentinel, Cluster) and
// the Redis Store: it runs the scripts of package lua with EVALSHA, one key
// per call, under a short deadline.
//
// A Client wraps a rueidis client configured to fail fast: no client-side
// cache, no retries, short dial and write timeouts, and a deadline on every
// call. Concurrent calls share connections (rueidis auto-pipelining), so a
// strict check costs one pipelined round trip.
//
// A Store implements policy.Store on a Client: every algorithm of package
// algo, decided atomically in Redis on Redis's clock, with the same answers
// as the embedded store.
//
// Every call of a Store goes through a circuit breaker (Breaker) of the
// node it is for: one for a standalone server or a Sentinel primary, one
// per primary in a Cluster (picked by the key's slot; see Client). While a
// breaker is open its calls fail at once with a *BreakerOpenError; the
// Client probes the node in the background and closes the breaker when it
// answers again.
package redisx
