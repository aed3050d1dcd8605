package daemon

import (
	"bytes"
	"io"
	"strings"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/changestore"
	"github.com/rld/rld/decisions"
	"github.com/rld/rld/envoyrls"
	"github.com/rld/rld/memstore"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/redisx"
	"github.com/rld/rld/region"
	"github.com/rld/rld/shardcache"
)

// daemonHelp is the # HELP text of each metric family the daemon itself
// registers.
var daemonHelp = map[string]string{
	"rld_build_info":                         "Always 1; the labels say which build runs (version, commit, goversion).",
	"rld_check_duration_seconds":             "Time from reading a batch of frames on a connection to having answered it.",
	"rld_frames_total":                       "Frames answered on the Unix socket.",
	"rld_frame_errors_total":                 "Frames rejected, by error code.",
	"rld_connections_open":                   "Client connections open on the Unix socket.",
	"rld_connections_accepted_total":         "Client connections accepted on the Unix socket.",
	"rld_connections_rejected_total":         "Client connections closed at once for exceeding server.max_connections.",
	"rld_http_checks_total":                  "Requests to the HTTP check endpoints (/v1/check, /v1/auth, /v1/acquire), refused ones included.",
	"rld_http_rejected_total":                "HTTP check requests refused with 400 (a malformed query, a bad cost or peek, a client address not given by a trusted proxy).",
	"rld_http_check_duration_seconds":        "Time from an HTTP check's handler start to its answer built.",
	"rld_config_reloads_total":               "Configuration reloads by result.",
	"rld_config_last_reload_successful":      "1 when the configuration in force is the file's (the last load or reload succeeded), 0 after a rejected reload.",
	"rld_fleet_daemons":                      "Live daemons on the shared Redis at the last heartbeat.",
	"rld_config_info":                        "Always 1; the label hash names the configuration in force.",
	"rld_config_last_load_timestamp_seconds": "When the configuration in force was loaded (Unix seconds).",
	"rld_changes_compiles_total":             "Rule sets compiled for a change of the overrides and blocks (a burst of automatic blocks counts once).",
	"rld_changes_overrides":                  "Overrides compiled into the rules in force (expired ones count until the next change or load drops them).",
	"rld_changes_blocks":                     "Blocks compiled into the rules in force (expired ones count until the next change or load drops them).",
	"rld_changes_orphaned":                   "Overrides and blocks whose rule the configuration in force does not have.",
}

// metricHelp is the # HELP text of each rld metric family, from the
// package that registers it: /metrics is where an operator meets them
// first. docs/operations.md lists the same.
var metricHelp = joinHelp(daemonHelp, admin.MetricHelp(), policy.MetricHelp(), memstore.MetricHelp(),
	shardcache.MetricHelp(), redisx.MetricHelp(), envoyrls.MetricHelp(), changestore.MetricHelp(),
	decisions.MetricHelp(), region.MetricHelp())

// joinHelp joins the help texts of the packages; a family two of them
// name is a programming error.
func joinHelp(parts ...map[string]string) map[string]string {
	all := map[string]string{}
	for _, part := range parts {
		for name, text := range part {
			if _, dup := all[name]; dup {
				panic("daemon: two packages give a help text for the metric family " + name)
			}
			all[name] = text
		}
	}
	return all
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
