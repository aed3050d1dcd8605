package daemon

import (
	"bytes"
	"io"
	"strings"

	"github.com/VictoriaMetrics/metrics"
)

// metricHelp is the # HELP text of each rld metric family: /metrics is
// where an operator meets them first. docs/operations.md lists the same.
var metricHelp = map[string]string{
	"rld_build_info":                         "Always 1; the labels say which build runs (version, commit, goversion).",
	"rld_checks_total":                       "Checks by the rule that decided (allow, deny, none, or a rule's name) and decision.",
	"rld_check_duration_seconds":             "Time from reading a batch of frames on a connection to having answered it.",
	"rld_frames_total":                       "Frames answered on the Unix socket.",
	"rld_frame_errors_total":                 "Frames rejected, by error code.",
	"rld_connections_open":                   "Client connections open on the Unix socket.",
	"rld_connections_accepted_total":         "Client connections accepted on the Unix socket.",
	"rld_connections_rejected_total":         "Client connections closed at once for exceeding server.max_connections.",
	"rld_http_checks_total":                  "Requests to the HTTP check endpoints (/v1/check, /v1/auth, /v1/acquire), refused ones included.",
	"rld_http_rejected_total":                "HTTP check requests refused with 400 (a malformed query, a bad cost or peek, a client address not given by a trusted proxy).",
	"rld_http_check_duration_seconds":        "Time from an HTTP check's handler start to its answer built.",
	"rld_auto_blocks_total":                  "Automatic blocks stored by a rule's block_after, by rule.",
	"rld_admin_refused_total":                "Admin requests refused, by reason (no_token, wrong_token, uid, role, method, not_found, bad_request, unknown_op, internal).",
	"rld_config_reloads_total":               "Configuration reloads by result.",
	"rld_config_last_reload_successful":      "1 when the configuration in force is the file's (the last load or reload succeeded), 0 after a rejected reload.",
	"rld_fleet_daemons":                      "Live daemons on the shared Redis at the last heartbeat.",
	"rld_config_info":                        "Always 1; the label hash names the configuration in force.",
	"rld_config_last_load_timestamp_seconds": "When the configuration in force was loaded (Unix seconds).",
	"rld_decision_log_lines_total":           "Lines written to the decision log, by kind.",
	"rld_decision_log_capped_total":          "Sampled denials left out of the decision log by denied_per_second.",
	"rld_decision_log_write_errors_total":    "Decision log lines that could not be written.",
	"rld_store_keys":                         "Counter keys held by the embedded store.",
	"rld_store_evictions_total":              "Keys evicted from the embedded store to stay under store.max_keys.",
	"rld_store_swept_total":                  "Idle keys removed from the embedded store.",
	"rld_refund_errors_total":                "Refunds the store failed to apply (quota lost until the keys expire, never extra admissions).",
	"rld_fallback_seeded_total":              "Keys whose fail-open local state started from what the cache last knew of them, not from a full share.",
	"rld_cache_decisions_total":              "Checks of cached rules by where they were decided: local (a lease), denied_locally, redis.",
	"rld_cache_store_calls_total":            "Redis calls made for checks of cached rules (one per coalesced batch).",
	"rld_cache_misses_total":                 "Checks of cached rules that waited on Redis, by why the host could not answer: new, spent, lapsed, window, returned, recalled, denied, no_lease.",
	"rld_cache_late_answers_total":           "Take-with-lease calls answered after store.timeout, whose grant was given back to Redis.",
	"rld_cache_late_units_returned_total":    "Lease units of late take-with-lease answers given back to Redis.",
	"rld_envoy_requests_total":               "ShouldRateLimit calls of the Envoy face, by overall code (ok, over_limit, invalid, unavailable).",
	"rld_cache_recalls_total":                "Recalls of other daemons' lease units for a refused check (sent), those after which the check was admitted, other daemons' recalls received (and returned a lease for); settles' refunds announced to the other daemons (refund_sent) and their announcements received (refund_received).",
	"rld_changes_compiles_total":             "Rule sets compiled for a change of the overrides and blocks (a burst of automatic blocks counts once).",
	"rld_changes_loads_total":                "With Redis: loads of the fleet's overrides and blocks, via announce or poll.",
	"rld_changes_load_errors_total":          "With Redis: loads of the fleet's overrides and blocks that failed, and entries that could not be read.",
	"rld_changes_restores_total":             "With Redis: restores of the overrides and blocks Redis had lost; role began (this daemon found them lost) or joined.",
	"rld_changes_restored_entries_total":     "With Redis: overrides and blocks this daemon wrote back to a Redis that had lost them.",
	"rld_top_publish_errors_total":           "With Redis: reports of this daemon's top denied keys that could not be published for the fleet's top.",
	"rld_changes_overrides":                  "Overrides compiled into the rules in force (expired ones count until the next change or load drops them).",
	"rld_changes_blocks":                     "Blocks compiled into the rules in force (expired ones count until the next change or load drops them).",
	"rld_changes_orphaned":                   "Overrides and blocks whose rule the configuration in force does not have.",
	"rld_releases_total":                     "Concurrency slots given back by a release or settle (released), and releases and settles answered not_found (unknown): the lease holds nothing any more, was settled already, is too old or not signed with this fleet's key.",
	"rld_settle_units_total":                 "Units that settles charged above their estimates (charge) and refunded below them (refund).",
	"rld_cache_lease_units_total":            "Lease units granted by Redis, returned unused, and lost.",
	"rld_cache_entries":                      "Keys held by the hot-key cache.",
	"rld_cache_evictions_total":              "Keys dropped from the hot-key cache to stay under store.max_keys.",
	"rld_cache_syncs_total":                  "Runs of the cache's sync loop.",
	"rld_cache_sync_ops_total":               "Operations sent to Redis by the sync loop (returns, renewals, refreshes).",
	"rld_cache_sync_errors_total":            "Sync loop runs that failed.",
	"rld_cache_sync_visits_total":            "Cached keys the sync loop visited: those with something due at its tick (see docs/cache.md, What a tick visits).",
	"rld_cache_sync_duration_seconds":        "Duration of the sync loop's runs.",
	"rld_coalesce_batch_size":                "Checks per coalesced Redis call.",
	"rld_redis_calls_total":                  "Redis calls by op and result: ok, timeout, error, breaker_open (refused, not sent).",
	"rld_redis_call_duration_seconds":        "Duration of Redis calls by op.",
	"rld_redis_connect_errors_total":         "Failed attempts to connect to Redis at start (a lost connection later shows in rld_redis_calls_total and the breakers).",
	"rld_redis_slot_refresh_errors_total":    "Cluster slot map refreshes that reached no node.",
	"rld_redis_redirections_total":           "Cluster calls the node named by the slot map answered MOVED or ASK, sent again through rueidis.",
	"rld_redis_breaker_state":                "Circuit breaker of each Redis node: 0 closed, 1 open, 2 half-open.",
	"rld_redis_breaker_transitions_total":    "Circuit breaker changes of state, by node and new state.",
	"rld_region_renewals_total":              "Global keys' shares renewed on the global store by this daemon as its region's renewer.",
	"rld_region_returns_total":               "Renewals that lowered a live share: units given back for the other regions.",
	"rld_region_reclaims_total":              "Renewals that took back the share of a region whose lease had expired.",
	"rld_region_fallback_decisions_total":    "Decisions of global rules made with a key's fallback share: no live lease (new key, or the global store out of reach).",
	"rld_region_renew_errors_total":          "Key renewals on the global store that failed; the region keeps its shares until they expire.",
	"rld_region_renewer":                     "1 while this daemon is its region's renewer, else 0.",
}

// writeMetrics writes every metric in the Prometheus text format, lint-clean
// for promtool check metrics: each family gets its # HELP text (from
// metricHelp; the Go runtime's and the process's a generic one), a gauge
// the library names *_total (cumulative /proc counters) is typed as the
// counter it is, and a family whose name breaks the naming conventions
// otherwise (a counter without _total, a gauge named *_count) is left out:
// only a few of the library's Go runtime metrics are.
func writeMetrics(w io.Writer) {
	var buf bytes.Buffer
	metrics.WritePrometheus(&buf, true)
	out := make([]byte, 0, buf.Len()+len(metricHelp)*64)
	rest := buf.Bytes()
	for len(rest) > 0 {
		// One family: "# HELP", "# TYPE", then its samples up to the next
		// "# HELP" line.
		end := bytes.Index(rest[1:], []byte("\n# HELP "))
		var fam []byte
		if end < 0 {
			fam, rest = rest, nil
		} else {
			fam, rest = rest[:end+2], rest[end+2:]
		}
		out = appendFamily(out, fam)
	}
	_, _ = w.Write(out)
}

// appendFamily appends one family of the library's output to dst, with its
// help text, retyped or left out as writeMetrics says.
func appendFamily(dst, fam []byte) []byte {
	help, afterHelp, ok := bytes.Cut(fam, []byte("\n"))
	name, isHelp := strings.CutPrefix(string(help), "# HELP ")
	typeLine, samples, _ := bytes.Cut(afterHelp, []byte("\n"))
	typ, isType := strings.CutPrefix(string(typeLine), "# TYPE "+name+" ")
	if !ok || !isHelp || !isType {
		return append(dst, fam...) // not the shape the library writes: as is
	}
	name = strings.TrimSpace(name)
	switch {
	case typ == "gauge" && strings.HasSuffix(name, "_total"):
		typ = "counter"
	case typ == "counter" && !strings.HasSuffix(name, "_total"),
		typ != "histogram" && typ != "summary" && (strings.HasSuffix(name, "_count") ||
			strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_bucket")):
		return dst
	}
	text, ok := metricHelp[name]
	switch {
	case ok:
	case strings.HasPrefix(name, "go_"):
		text = "Go runtime metric " + name + " (runtime/metrics)."
	case strings.HasPrefix(name, "process_"):
		text = "Process metric " + name + " (from /proc)."
	default:
		text = "rld metric " + name + "; see docs/operations.md."
	}
	dst = append(dst, "# HELP "+name+" "+text+"\n# TYPE "+name+" "+typ+"\n"...)
	return append(dst, samples...)
}
