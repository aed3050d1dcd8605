// Package redisx is rld's Redis client (standalone, Sentinel, Cluster) and
// the Redis Store: it runs the scripts of package lua with EVALSHA, one key
// per call, under a short deadline.
//
// A Client wraps a rueidis client configured to fail fast: no client-side
// cache, no retries, short dial and write timeouts, and a deadline on every
// call. Concurrent calls share connections (rueidis auto-pipelining), so a
// strict check costs one pipelined round trip. On a standalone Redis, a
// single call that no other overlaps (a check, or a Do of one op such as
// the hot-key cache's miss) goes over a connection of its own, written
// and read by the calling goroutine: it skips the pipeline's two
// goroutine hand-offs, which cost more CPU than the rest of a strict
// check; that connection is peeked at before each use, so one Redis has
// closed is replaced, never used (see directBusy).
//
// A Store implements policy.Store on a Client: every algorithm of package
// algo, decided atomically in Redis on Redis's clock, with the same answers
// as the embedded store. Its Do (Sync) runs a batch of algo.Ops and makes
// it the hot-key cache's backend as it is.
//
// # One way to Redis
//
// Every call reaches Redis by one function, Client.call: the circuit
// breaker of the node (package breaker), then rueidis under the call's
// deadline, then the result, which the breaker counts (isFailure says
// which errors mean the node is unhealthy). A single call (a check, a
// lease, a refund: one algo.Op, Store.one; a heartbeat: Client.exec, one
// script on one key) is one call through it; a batch (Store.Do) groups its
// ops by node, and each node's share is one call through it, the nodes'
// calls concurrent. An op's script call is built in one place from the op
// table (algo.OpInfo: its arguments, its reply), meets a lost script
// (NOSCRIPT) in one place (multiBuf.send: SCRIPT LOAD, then EVAL), and its
// reply is read by algo.Op.SetReply, whether the op is single or one of
// a batch. One
// breaker guards a standalone server or a Sentinel primary; in a Cluster,
// one guards each primary, and one more the slots no known primary serves.
// While a breaker is open its calls fail at once with a
// *breaker.OpenError; the Client probes the node in the background (PING,
// the only call that takes the breaker's probe tickets) and the breaker
// closes when the node answers again.
//
// # Why a slot map of its own
//
// In a Cluster, a call's breaker must be picked before the call, by the
// node that serves its key's slot. rueidis (v1.0.79) routes by slot but
// does not say to whom: its slot table is private, Client.Nodes returns
// only the address of each node (a new map at every call), and its
// topology hooks (ReadNodeSelector, ReplicaSelector) see only reads sent
// to replicas. So the Client keeps its own slot map (slots.go), refreshed
// from CLUSTER SHARDS every second and soon after a call fails, beside
// rueidis's. The map picks the breaker and the connection together: a
// call goes to the primary the map names, on rueidis's connection to that
// node (from Client.Nodes at the refresh). rueidis's own map follows a
// failover only after a random delay of up to a second (it refreshes
// lazily, after an error or its periodic scan), and until then it sent a
// promoted primary's keys to the dead node, whose failures opened the new
// primary's breaker: the daemons stayed degraded up to a second after the
// cluster had agreed on the new primary (0.35–0.9 s measured), against
// 0–0.1 s now. A map that is behind (a slot migrated, a failover not yet
// seen) meets MOVED, and a slot being migrated ASK: the call, or a
// batch's redirected ops, is made again through rueidis, which follows
// the redirection (nothing ran on a redirecting node; its breaker counts
// its answer, not the call's outcome elsewhere), and after a MOVED the
// map is refreshed soon (rld_redis_redirections_total counts them). A
// map whose refreshes keep failing gives up its connections after
// nodeTrust (3 s), before rueidis would close a connection that it holds
// for a node gone from the topology: calls then go through rueidis's
// routing.
package redisx
