// Package shardcache is rld's sharded, lock-striped hot-key cache: it holds
// per-key leases of the shared store's quota, so that most decisions are
// made on the host, and a sync loop that returns, renews and refreshes
// them.
//
// # Leases
//
// A lease is quota taken from the shared store (Redis) exactly as if that
// many requests had been admitted there; the cache then admits requests
// from it with no network call. So the fleet never admits more than the
// limit: every unit admitted anywhere was first taken in Redis. What a
// lease costs is the other direction: units a daemon holds are not
// available to the others until it uses or returns them, which the sync
// loop does every Options.SyncInterval.
//
// For a check of a cached rule, Cache.Take:
//
//   - admits locally when the key's lease covers the cost;
//   - denies locally while the key is denied-until a time the store gave,
//     with the exact retry-after (at most a sync interval, unless the key
//     is far over its limit; then a bucket's is at least a hold of a sync
//     interval per daemon, whose call takes the refill as a lease);
//   - otherwise asks the store, through a coalesce.Group, so that at most
//     one call per key is in flight and the checks that arrive meanwhile
//     go as one batch: the call decides the batch's costs in arrival order
//     and leases about one sync interval of the key's local traffic,
//     capped at the key's last known remaining quota divided among the
//     live daemons (twice over), so that near the limit the lease is 0 and
//     every check is decided by the store.
//
// # Recalls
//
// With Options.Holder, the store counts the units each daemon has out on
// lease of a key (every op the cache sends reports what it admitted from
// its lease since the last one). A take the store refuses while other
// daemons hold unused units of the key is not refused on that alone: the
// cache recalls them (Options.Recall: the daemon announces the key on a
// pub/sub channel; the holders' Cache.Recalled returns their lease at
// once) and retries until the take fits, nothing is parked any more, or
// Options.RecallWait passes, on a budget of Options.Timeout from the
// refusal, whatever the refused take took. A reset (Cache.Do) recalls the key's leases
// first, leaves a fresh key less the units still out, and announces the
// key again so that the other daemons drop their view of it. A settle's
// refund (Cache.Do) drops the key's denial and view here and, when the
// key was short of quota, is announced (Options.Refunded): the other
// daemons drop their denial and view of it (Cache.Corrected), so that
// the refunded units are usable on every daemon at once.
//
// A lease of a windowed algorithm (fixed window, sliding counter) holds
// slots of the window it was taken in and is valid only while that window
// is current, less a margin for the call's duration; the store's clock
// decides where windows end. A sliding-log rule is never cached (a lease
// would let its log forget admissions early): the configuration makes it
// strict.
//
// # Sync
//
// Every interval the sync loop, in pipelined calls of 8 ops (at most 16
// calls a tick, larger when a tick has more; Backend.Sync), returns the
// leases of keys that saw no traffic and the leases that expired, tops
// up the leases of keys that are still hot,
// refreshes the remaining quota of the others that are hot, and drops
// entries idle for two intervals. It visits only the entries that have
// something due (a timing wheel per shard: the keys checked since the
// last tick but for those whose warm lease is far from running low, the
// leases that go back when idle, a warm lease near its lifetime's end),
// not every key it holds. Close returns every lease.
//
// # Peeks
//
// A peek (a check that takes nothing) is answered like a take from the
// key's lease or denial, else from the store's last answer while it is
// younger than a sync interval; else by one store call, coalesced per key,
// whose answer the entry keeps like a take's. The peeks a denied check
// makes of its later rules (Cache.PeekForDenial) keep an allowed answer
// for the denial's retry-after: a key hammered under several rules costs
// the store about one call per retry-after, as under one.
//
// # Time
//
// The cache reads no clock of its own to decide: checks, Sync and
// ReturnIdle take their time as an argument, and the times of its store
// calls come from Options.Clock. Run drives Sync and ReturnIdle on the
// wall clock; the tests drive them, and the clock, themselves.
//
// # Strict rules
//
// Cache.Strict gives the Store of strict rules: every decision is made by
// the store, coalesced per key, and nothing is leased. The store's last
// answer for a strict key is kept as a cached key's is (an entry with
// no lease, dropped when idle), so that Cache.Known tells a fail-open
// fallback what the key had left before an outage.
package shardcache
