package changestore

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_changes_loads_total":            "With Redis: loads of the fleet's overrides and blocks, via announce or poll.",
		"rld_changes_load_errors_total":      "With Redis: loads of the fleet's overrides and blocks that failed, and entries that could not be read.",
		"rld_changes_restores_total":         "With Redis: restores of the overrides and blocks Redis had lost; role began (this daemon found them lost) or joined.",
		"rld_changes_restored_entries_total": "With Redis: overrides and blocks this daemon wrote back to a Redis that had lost them.",
	}
}
