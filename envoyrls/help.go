package envoyrls

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_envoy_requests_total": "ShouldRateLimit calls of the Envoy face, by overall code (ok, over_limit, invalid, unavailable).",
	}
}
