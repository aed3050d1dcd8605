package decisions

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_decision_log_lines_total":        "Lines written to the decision log, by kind.",
		"rld_decision_log_capped_total":       "Sampled denials left out of the decision log by denied_per_second.",
		"rld_decision_log_write_errors_total": "Decision log lines that could not be written.",
		"rld_top_publish_errors_total":        "With Redis: reports of this daemon's top denied keys that could not be published for the fleet's top.",
	}
}
