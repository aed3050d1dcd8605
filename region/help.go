package region

// MetricHelp returns the # HELP text of each metric family the package
// registers (docs/operations.md lists the same).
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_region_renewals_total":           "Global keys' shares renewed on the global store by this daemon as its region's renewer.",
		"rld_region_returns_total":            "Renewals that lowered a live share: units given back for the other regions.",
		"rld_region_reclaims_total":           "Renewals that took back the share of a region whose lease had expired.",
		"rld_region_fallback_decisions_total": "Decisions of global rules made with a key's fallback share: no live lease (new key, or the global store out of reach).",
		"rld_region_renew_errors_total":       "Key renewals on the global store that failed; the region keeps its shares until they expire.",
		"rld_region_early_renewals_total":     "Second renewals in a pass of keys a daemon of the region refused under their share and asked to renew early, their demand raised (while the regions' demand is within the limit).",
		"rld_region_strict_renewals_total":    "Renewals on the global store made at once by a check of a strict global rule's key with no live share in the region (one per key in flight per daemon).",
		"rld_region_strict_unanswered_total":  "Checks of strict global rules' keys with no live share that the global store gave none within two intervals: decided by the rule's fail mode.",
		"rld_region_renewer":                  "1 while this daemon is its region's renewer, else 0.",
	}
}
