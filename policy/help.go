package policy

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_checks_total":          "Checks by the rule that decided (allow, deny, none, or a rule's name) and decision.",
		"rld_auto_blocks_total":     "Automatic blocks stored by a rule's block_after, by rule.",
		"rld_refund_errors_total":   "Refunds the store failed to apply (quota lost until the keys expire, never extra admissions).",
		"rld_fallback_seeded_total": "Keys whose fail-open local state started from what the cache last knew of them, not from a full share.",
		"rld_releases_total":        "Concurrency slots given back by a release or settle (released), and releases and settles answered not_found (unknown): the lease holds nothing any more, was settled already, is too old or not signed with this fleet's key.",
		"rld_settle_units_total":    "Units that settles charged above their estimates (charge) and refunded below them (refund).",
		"rld_rollout_limited_total": "Checks of keys outside a rule's enforce share that the rule would have refused, and admitted (shadow_limited in rld_checks_total too), by rule.",
	}
}
