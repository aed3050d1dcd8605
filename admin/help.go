package admin

// MetricHelp returns the # HELP text of each metric family this package
// registers, by family name: the daemon's /metrics writes them, and
// docs/operations.md lists the same families.
func MetricHelp() map[string]string {
	return map[string]string{
		"rld_admin_refused_total": "Admin requests refused, by reason (no_token, wrong_token, uid, role, method, not_found, bad_request, unknown_op, internal).",
	}
}
