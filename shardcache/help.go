package shardcache

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_cache_decisions_total":             "Checks of cached rules by where they were decided: local (a lease), denied_locally, redis.",
		"rld_cache_store_calls_total":           "Redis calls made for checks of cached rules (one per coalesced batch).",
		"rld_cache_misses_total":                "Checks of cached rules that waited on Redis, by why the host could not answer: new, spent, lapsed, window, returned, recalled, denied, no_lease.",
		"rld_cache_late_answers_total":          "Take-with-lease calls answered after store.timeout, whose grant was given back to Redis.",
		"rld_cache_late_units_returned_total":   "Lease units of late take-with-lease answers given back to Redis.",
		"rld_cache_lost_grants_reclaimed_total": "Take-with-lease calls that timed out after they may have run (their answer lost), whose possible grant was given back to Redis with the key's lease.",
		"rld_cache_recalls_total":               "Recalls of other daemons' lease units for a refused check (sent), those after which the check was admitted, other daemons' recalls received (and returned a lease for), grants that came after a recall of their key and went back at once (returned_late), checks of a waiting recall admitted from this daemon's own lease (own_lease); settles' refunds announced to the other daemons (refund_sent) and their announcements received (refund_received).",
		"rld_cache_lease_units_total":           "Lease units granted by Redis, returned unused, and lost.",
		"rld_cache_entries":                     "Keys held by the hot-key cache.",
		"rld_cache_evictions_total":             "Keys dropped from the hot-key cache to stay under store.max_keys.",
		"rld_cache_syncs_total":                 "Runs of the cache's sync loop.",
		"rld_cache_sync_ops_total":              "Operations sent to Redis by the sync loop (returns, renewals, refreshes).",
		"rld_cache_sync_errors_total":           "Sync loop runs that failed.",
		"rld_cache_sync_visits_total":           "Cached keys the sync loop visited: those with something due at its tick (see docs/cache.md, What a tick visits).",
		"rld_cache_sync_duration_seconds":       "Duration of the sync loop's runs.",
		"rld_coalesce_batch_size":               "Checks per coalesced Redis call.",
	}
}
