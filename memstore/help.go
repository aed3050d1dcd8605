package memstore

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_store_keys":            "Counter keys held by the embedded store.",
		"rld_store_evictions_total": "Keys evicted from the embedded store to stay under store.max_keys.",
		"rld_store_swept_total":     "Idle keys removed from the embedded store.",
	}
}
