// Package shardcache is rld's sharded, lock-striped hot-key cache: it holds
// per-key leases of Redis quota so most decisions are made on the host, and
// a sync loop that returns, renews and refreshes them.
//
// The hot-path issue fills this package; the embedded store (memstore) and
// the policy engine do not depend on it.
package shardcache
