package redisx

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_redis_calls_total":               "Redis calls by op and result: ok, timeout, error, breaker_open (refused, not sent).",
		"rld_redis_call_duration_seconds":     "Duration of Redis calls by op.",
		"rld_redis_connect_errors_total":      "Failed attempts to connect to Redis at start (a lost connection later shows in rld_redis_calls_total and the breakers).",
		"rld_redis_slot_refresh_errors_total": "Cluster slot map refreshes that reached no node.",
		"rld_redis_redirections_total":        "Cluster calls the node named by the slot map answered MOVED or ASK, sent again through rueidis.",
		"rld_redis_breaker_state":             "Circuit breaker of each Redis node: 0 closed, 1 open, 2 half-open.",
		"rld_redis_breaker_transitions_total": "Circuit breaker changes of state, by node and new state.",
	}
}
