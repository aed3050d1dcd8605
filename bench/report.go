package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/rld/rld/wire"
)

// Report is everything one rld-bench invocation measured, as -json
// prints it: the load, then one table per store of the spawned daemon.
type Report struct {
	// Mode is "open" or "closed".
	Mode string `json:"mode"`
	// Rate is the target rate in requests/s (open loop; 0 in closed loop).
	Rate float64 `json:"rate"`
	// Connections is the number of connections to each target.
	Connections int `json:"connections"`
	// Depth is the most requests in flight on one connection.
	Depth int `json:"depth"`
	// DurationS is the measurement's length in seconds.
	DurationS float64 `json:"duration_s"`
	// WarmupS is the warm-up's length in seconds, not measured.
	WarmupS float64 `json:"warmup_s"`
	// Keys describes the key distribution.
	Keys string `json:"keys"`
	// Descriptors is the descriptor template; {n} is the key number.
	Descriptors string `json:"descriptors"`
	// Cost is the cost of every check.
	Cost uint32 `json:"cost"`
	// Tables holds one table per store of the spawned daemon, or a single
	// one when rld-bench spawned none.
	Tables []Table `json:"tables"`
}

// Table is the results of every target under the same load, in the
// order measured; ratios are to the first.
type Table struct {
	// Store is the spawned daemon's store ("embedded" or "redis"), or ""
	// when the daemon was not spawned.
	Store string `json:"store,omitempty"`
	// Mode is the spawned daemon's rule mode ("cached" or "strict") when
	// -rule-mode named several; each gets a table on Redis.
	Mode string `json:"rule_mode,omitempty"`
	// Results holds one result per target.
	Results []Result `json:"results"`
}

// Result is what one target's run measured.
type Result struct {
	// Target names the target: echo, redis, rld or rld-on-redis.
	Target string `json:"target"`
	// AchievedRate is the answers that arrived in the window, per second.
	AchievedRate float64 `json:"achieved_rate"`
	// Requests is the number of requests due in the window that were
	// answered; the counts below and the latencies are theirs.
	Requests int64 `json:"requests"`
	// Allowed counts allowed answers.
	Allowed int64 `json:"allowed"`
	// Limited counts limited and blocked answers.
	Limited int64 `json:"limited"`
	// Blocked counts blocked answers (included in Limited).
	Blocked int64 `json:"blocked"`
	// Degraded counts allowed-degraded answers.
	Degraded int64 `json:"degraded"`
	// Errors counts error answers.
	Errors int64 `json:"errors"`
	// Timeouts counts requests sent but not answered before the run's
	// hard stop (drainTimeout after the window).
	Timeouts int64 `json:"timeouts"`
	// Unsent counts open-loop requests due in the window that could not
	// be sent before the hard stop.
	Unsent int64 `json:"unsent"`
	// Strays counts answers whose id was not in flight.
	Strays int64 `json:"strays"`
	// ErrorCodes counts error answers by code.
	ErrorCodes map[string]int64 `json:"error_codes,omitempty"`
	// FirstError is the first error answer's code and message.
	FirstError string `json:"first_error,omitempty"`
	// Latency summarises the latencies, in µs.
	Latency Latency `json:"latency_us"`
	// SendLag summarises how late the open-loop client sent requests, in
	// µs: a part of every latency that is the client's, not the target's.
	SendLag *Latency `json:"send_lag_us,omitempty"`
	// Ratio is this target's latencies divided by the first target's.
	Ratio *Latency `json:"ratio_to_first,omitempty"`
	// Costs is what the decisions cost in CPU and Redis calls, where
	// rld-bench could read it (see Costs).
	Costs *Costs `json:"costs,omitempty"`
	// Bound is the allowed answers of each key over the whole run against
	// the most its rule may admit, where rld-bench knows the rule.
	Bound *Bound `json:"bound,omitempty"`
	// Histogram is the latency histogram (ns), in HdrHistogram's
	// compressed V2 encoding, base64: HdrHistogram's tools read it.
	Histogram string `json:"histogram"`

	hist *hdrhistogram.Histogram
}

// Latency is a latency summary: µs, or, in Result.Ratio, ratios.
type Latency struct {
	// Min is the lowest value.
	Min float64 `json:"min"`
	// P50 is the median.
	P50 float64 `json:"p50"`
	// P90 is the 90th percentile.
	P90 float64 `json:"p90"`
	// P99 is the 99th percentile.
	P99 float64 `json:"p99"`
	// P999 is the 99.9th percentile.
	P999 float64 `json:"p99.9"`
	// P9999 is the 99.99th percentile.
	P9999 float64 `json:"p99.99"`
	// Max is the highest value.
	Max float64 `json:"max"`
	// Mean is the mean.
	Mean float64 `json:"mean"`
}

// summarize returns the summary of h (ns) in µs.
func summarize(h *hdrhistogram.Histogram) Latency {
	us := func(ns int64) float64 { return math.Round(float64(ns)/1e1) / 1e2 } // µs, 2 decimals
	return Latency{
		Min: us(h.Min()), P50: us(h.ValueAtQuantile(50)), P90: us(h.ValueAtQuantile(90)),
		P99: us(h.ValueAtQuantile(99)), P999: us(h.ValueAtQuantile(99.9)), P9999: us(h.ValueAtQuantile(99.99)),
		Max: us(h.Max()), Mean: math.Round(h.Mean()/1e1) / 1e2,
	}
}

// ratio returns a / b field by field, rounded to 2 decimals (0 where b is 0).
func ratio(a, b Latency) *Latency {
	r := func(x, y float64) float64 {
		if y == 0 {
			return 0
		}
		return math.Round(x/y*100) / 100
	}
	return &Latency{Min: r(a.Min, b.Min), P50: r(a.P50, b.P50), P90: r(a.P90, b.P90), P99: r(a.P99, b.P99),
		P999: r(a.P999, b.P999), P9999: r(a.P9999, b.P9999), Max: r(a.Max, b.Max), Mean: r(a.Mean, b.Mean)}
}

// newResult makes the Result of target's measurement m under l.
func newResult(target string, m *measurement, l *load) (Result, error) {
	r := Result{
		Target:       target,
		AchievedRate: math.Round(float64(m.arrived) / l.duration.Seconds()),
		Requests:     m.answered,
		Allowed:      m.byStatus[wire.StatusAllowed],
		Limited:      m.byStatus[wire.StatusLimited] + m.byStatus[wire.StatusBlocked],
		Blocked:      m.byStatus[wire.StatusBlocked],
		Degraded:     m.byStatus[wire.StatusAllowedDegraded],
		Errors:       m.byStatus[wire.StatusError],
		Timeouts:     m.timeouts(),
		Unsent:       m.unsent,
		Strays:       m.strays,
		FirstError:   m.firstErr,
		Latency:      summarize(m.hist),
		Costs:        m.costs,
		Bound:        m.bound,
		hist:         m.hist,
	}
	if len(m.byCode) > 0 {
		r.ErrorCodes = map[string]int64{}
		for c, n := range m.byCode {
			r.ErrorCodes[c.String()] = n
		}
	}
	if l.mode == modeOpen {
		lag := summarize(m.lag)
		r.SendLag = &lag
	}
	enc, err := m.hist.Encode(hdrhistogram.V2CompressedEncodingCookieBase)
	if err != nil {
		return r, fmt.Errorf("cannot encode the histogram of %s: %w", target, err)
	}
	r.Histogram = base64.StdEncoding.EncodeToString(enc)
	return r, nil
}

// failures returns the requests of r that got no decision.
func (r *Result) failures() int64 { return r.Errors + r.Timeouts + r.Unsent + r.Strays }

// setRatios fills the Ratio of every result but the first.
func (t *Table) setRatios() {
	for i := 1; i < len(t.Results); i++ {
		t.Results[i].Ratio = ratio(t.Results[i].Latency, t.Results[0].Latency)
	}
}

// writeJSON writes rep as indented JSON.
func writeJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("cannot write JSON: %w", err)
	}
	return nil
}

// describe returns the load's one-paragraph description.
func (rep *Report) describe() string {
	var b strings.Builder
	if rep.Mode == modeOpen {
		fmt.Fprintf(&b, "open loop at %s req/s (latency from when each request was due)", group(int64(rep.Rate)))
	} else {
		b.WriteString("closed loop (latency from when each request was sent)")
	}
	fmt.Fprintf(&b, ", %d connections × %d in flight, %v after a %v warm-up\n", rep.Connections, rep.Depth,
		time.Duration(rep.DurationS*1e9), time.Duration(rep.WarmupS*1e9))
	fmt.Fprintf(&b, "keys: %s; descriptors: %s; cost %d\n", rep.Keys, rep.Descriptors, rep.Cost)
	return b.String()
}

// writeTable prints t side by side, a column per target, with each
// latency's ratio to the first target's.
func writeTable(w io.Writer, t *Table) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, cell func(r *Result) string) {
		fmt.Fprint(tw, name, "\t")
		for i := range t.Results {
			fmt.Fprint(tw, cell(&t.Results[i]), "\t")
		}
		fmt.Fprintln(tw)
	}
	count := func(f func(r *Result) int64) func(r *Result) string {
		return func(r *Result) string { return group(f(r)) }
	}
	lat := func(f func(l *Latency) float64) func(r *Result) string {
		return func(r *Result) string {
			s := formatMicros(f(&r.Latency))
			if r.Ratio != nil {
				s += fmt.Sprintf(" (%.2f×)", f(r.Ratio))
			}
			return s
		}
	}
	row("", func(r *Result) string { return r.Target })
	row("achieved/s", func(r *Result) string { return group(int64(r.AchievedRate)) })
	row("requests", count(func(r *Result) int64 { return r.Requests }))
	row("allowed", count(func(r *Result) int64 { return r.Allowed }))
	row("limited", count(func(r *Result) int64 { return r.Limited }))
	row("degraded", count(func(r *Result) int64 { return r.Degraded }))
	row("errors", count((*Result).failures))
	row("latency min", lat(func(l *Latency) float64 { return l.Min }))
	row("p50", lat(func(l *Latency) float64 { return l.P50 }))
	row("p90", lat(func(l *Latency) float64 { return l.P90 }))
	row("p99", lat(func(l *Latency) float64 { return l.P99 }))
	row("p99.9", lat(func(l *Latency) float64 { return l.P999 }))
	row("p99.99", lat(func(l *Latency) float64 { return l.P9999 }))
	row("max", lat(func(l *Latency) float64 { return l.Max }))
	if len(t.Results) > 0 && t.Results[0].SendLag != nil {
		row("send lag p50", func(r *Result) string { return formatMicros(r.SendLag.P50) })
		row("send lag p99", func(r *Result) string { return formatMicros(r.SendLag.P99) })
	}
	// A row per cost that some target has; "-" where a target has not.
	cost := func(name string, f func(c *Costs) *float64, format func(float64) string) {
		if !slices.ContainsFunc(t.Results, func(r Result) bool { return r.Costs != nil && f(r.Costs) != nil }) {
			return
		}
		row(name, func(r *Result) string {
			if r.Costs == nil || f(r.Costs) == nil {
				return "-"
			}
			return format(*f(r.Costs))
		})
	}
	calls := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	cost("CPU/decision", func(c *Costs) *float64 { return c.CPUPerDecisionUS }, formatMicros)
	cost("script calls/decision", func(c *Costs) *float64 { return c.ScriptCallsPerDecision }, calls)
	cost("Redis CPU/decision", func(c *Costs) *float64 { return c.RedisCPUPerDecisionUS }, formatMicros)
	bound := func(name string, cell func(b *Bound) string) {
		if !slices.ContainsFunc(t.Results, func(r Result) bool { return r.Bound != nil }) {
			return
		}
		row(name, func(r *Result) string {
			if r.Bound == nil {
				return "-"
			}
			return cell(r.Bound)
		})
	}
	bound("most allowed/key", func(b *Bound) string { return group(b.MostAllowed) + " of " + group(b.Limit) })
	bound("keys at ≥90% of it", func(b *Bound) string { return group(b.AtLimit) })
	bound("keys over it", func(b *Bound) string { return group(b.Over) })
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("cannot write table: %w", err)
	}
	for _, r := range t.Results {
		if b := r.Bound; b != nil && b.Over > 0 {
			fmt.Fprintf(w, "%s: BUG: %d keys were allowed more than %s admits over %.1fs (%d); the most: %d\n",
				r.Target, b.Over, b.Rule, b.Seconds, b.Limit, b.MostAllowed)
		}
	}
	for _, r := range t.Results {
		if r.Costs == nil || len(r.Costs.Nodes) == 0 {
			continue
		}
		fmt.Fprintf(w, "%s: script calls by Redis node:", r.Target)
		for _, n := range r.Costs.Nodes {
			fmt.Fprintf(w, " %s %s (%.1f%%, CPU %s/decision)", n.Addr, group(n.ScriptCalls), 100*n.Share, formatMicros(n.CPUPerDecisionUS))
		}
		fmt.Fprintln(w)
	}
	for _, r := range t.Results {
		if r.failures() > 0 {
			fmt.Fprintf(w, "%s: %d error answers, %d timeouts, %d unsent, %d strays", r.Target, r.Errors, r.Timeouts, r.Unsent, r.Strays)
			if r.FirstError != "" {
				fmt.Fprintf(w, "; first error: %s", r.FirstError)
			}
			fmt.Fprintln(w)
		}
	}
	return nil
}

// formatMicros formats a latency in µs with three significant digits,
// in µs, ms or s.
func formatMicros(us float64) string {
	unit := "µs"
	switch {
	case us >= 1e6:
		us, unit = us/1e6, "s"
	case us >= 1e3:
		us, unit = us/1e3, "ms"
	}
	switch {
	case us >= 100:
		return strconv.FormatFloat(us, 'f', 0, 64) + unit
	case us >= 10:
		return strconv.FormatFloat(us, 'f', 1, 64) + unit
	}
	return strconv.FormatFloat(us, 'f', 2, 64) + unit
}

// group formats n with thousands separators: 1,234,567.
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
