// Package decisions watches the decisions a daemon makes: it counts
// every denial in its rule's heavy-hitters sketch (the admin op top, for
// one daemon or merged across a fleet) and writes a sample of the
// decisions, and every admin change and configuration load, to the
// decision log.
package decisions

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/admin"
	"github.com/rld/rld/config"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/header"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/topk"
)

// TopKeys is how many keys the heavy-hitters sketch of each rule holds:
// a key denied more than 1/TopKeys of a rule's denials is always among
// them.
const TopKeys = 64

var (
	decisionLines = map[string]*metrics.Counter{
		"denied":  metrics.NewCounter(`rld_decision_log_lines_total{kind="denied"}`),
		"allowed": metrics.NewCounter(`rld_decision_log_lines_total{kind="allowed"}`),
		"admin":   metrics.NewCounter(`rld_decision_log_lines_total{kind="admin"}`),
		"config":  metrics.NewCounter(`rld_decision_log_lines_total{kind="config"}`),
	}
	// decisionsCapped counts the denials the cap left out.
	decisionsCapped = metrics.NewCounter(`rld_decision_log_capped_total`)
	decisionErrors  = metrics.NewCounter(`rld_decision_log_write_errors_total`)
)

// Observer watches the decisions: it counts every denial in its rule's
// heavy-hitters sketch, and writes a sample of the decisions, and every
// admin change, to the decision log. It is safe for concurrent use.
//
// On the check path, a decision that sampling skips costs a random draw
// and, for a denial, the one lock of its rule's sketch: no allocation.
type Observer struct {
	id string // the daemon's id in every line

	out           io.Writer // nil: the decision log is off
	closer        io.Closer // closes out, when it is a file
	deniedThresh  uint64    // a denial is logged when a random uint64 is below it
	allowedThresh uint64
	capPerSec     int64
	sec, inSec    atomic.Int64 // the second being capped, and lines logged in it

	mu  sync.Mutex // guards buf and the writes to out
	buf []byte

	topsMu sync.Mutex // serialises the creation of sketches
	tops   atomic.Pointer[map[string]*topk.Sketch]
}

// Scratch is the reusable buffer of one goroutine's observations.
type Scratch struct {
	key []byte
}

// threshold turns a rate in [0, 1] into a bound on a random uint64.
func threshold(rate float64) uint64 {
	switch {
	case rate <= 0:
		return 0
	case rate >= 1:
		return math.MaxUint64
	}
	return uint64(rate * (1 << 63) * 2)
}

// New opens the decision log that lc describes; id names the daemon in
// every line.
func New(lc config.Log, id string) (*Observer, error) {
	o := &Observer{id: id}
	m := map[string]*topk.Sketch{}
	o.tops.Store(&m)
	switch lc.Decisions {
	case "off", "":
		return o, nil
	case "stderr":
		o.out = os.Stderr
	default:
		f, err := os.OpenFile(lc.Decisions, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return nil, fmt.Errorf("cannot open log.decisions=%q: %w", lc.Decisions, err)
		}
		o.out, o.closer = f, f
	}
	o.deniedThresh = threshold(lc.DeniedRate)
	o.allowedThresh = threshold(lc.AllowedRate)
	o.capPerSec = int64(lc.DeniedPerSecond)
	return o, nil
}

// Close closes the decision log's file, if it is one.
func (o *Observer) Close() {
	if o.closer != nil {
		o.closer.Close()
	}
}

// sketch returns rule's sketch, creating it on its first denial.
func (o *Observer) sketch(rule string) *topk.Sketch {
	if s := (*o.tops.Load())[rule]; s != nil {
		return s
	}
	o.topsMu.Lock()
	defer o.topsMu.Unlock()
	old := *o.tops.Load()
	if s := old[rule]; s != nil {
		return s
	}
	m := make(map[string]*topk.Sketch, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	s := topk.New(TopKeys)
	m[rule] = s
	o.tops.Store(&m)
	return s
}

// Observe records one decision dec for descs, decided by p; start is when
// the request was read.
func (o *Observer) Observe(p *policy.Policy, dec *policy.Decision, descs []descriptor.Descriptor, start time.Time, sc *Scratch) {
	// An error answer (cost_too_large, internal) refuses the request too:
	// it is sampled, capped and counted as a denial.
	denied := !dec.Status.Allowed()
	keyed := false
	if dec.Status == policy.StatusLimited && dec.Rule != "" {
		var ok bool
		sc.key, ok = p.AppendKeyText(sc.key[:0], dec.Rule, descs)
		if ok {
			o.sketch(dec.Rule).Add(sc.key)
			keyed = true
		}
	}
	if o.out == nil {
		return
	}
	if denied {
		if o.deniedThresh == 0 || rand.Uint64() >= o.deniedThresh || !o.underCap(start) {
			return
		}
	} else if o.allowedThresh == 0 || rand.Uint64() >= o.allowedThresh {
		return
	}
	if !keyed && dec.Rule != "" && dec.Rule != policy.RuleDeny && dec.Rule != policy.RuleAllow {
		sc.key, _ = p.AppendKeyText(sc.key[:0], dec.Rule, descs)
	} else if !keyed {
		sc.key = sc.key[:0]
	}
	o.writeDecision(dec, sc.key, descs, start)
}

// underCap reports whether another denial may be logged in the second of
// now, and counts it; a cap of 0 lets every sampled denial through.
// Concurrent callers at a second's turn may let a few lines more through:
// the cap bounds the rate, not exactly.
func (o *Observer) underCap(now time.Time) bool {
	if o.capPerSec <= 0 {
		return true
	}
	sec := now.Unix()
	if o.sec.Load() != sec {
		o.sec.Store(sec)
		o.inSec.Store(0)
	}
	if o.inSec.Add(1) > o.capPerSec {
		decisionsCapped.Inc()
		return false
	}
	return true
}

// writeDecision writes one decision line:
//
//	{"time":"…","daemon":"…","kind":"decision","rule":"search","key":"api_key=k1",
//	 "decision":"limited","limit":30,"remaining":0,"retry_after_ms":1200,"latency_us":14,
//	 "descriptors":[["api_key","k1"],["endpoint","/v1/search"]]}
//
// descriptors are those decided on (derived from the request's attributes
// when it carried any), in order.
func (o *Observer) writeDecision(dec *policy.Decision, key []byte, descs []descriptor.Descriptor, start time.Time) {
	now := time.Now()
	kind := "allowed"
	if !dec.Status.Allowed() {
		kind = "denied"
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.begin(now, "decision")
	b = append(b, `,"rule":`...)
	b = strconv.AppendQuote(b, dec.Rule)
	b = append(b, `,"key":`...)
	b = appendJSONString(b, key)
	b = append(b, `,"decision":"`...)
	b = append(b, dec.Status.String()...)
	b = append(b, `","limit":`...)
	b = strconv.AppendInt(b, dec.Result.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, max(dec.Result.Remaining, 0), 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendUint(b, uint64(header.Millis(dec.Result.RetryAfter)), 10)
	b = append(b, `,"latency_us":`...)
	b = strconv.AppendInt(b, now.Sub(start).Microseconds(), 10)
	if dec.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	b = append(b, `,"descriptors":[`...)
	for i := range descs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = appendJSONString(b, descs[i].Name)
		b = append(b, ',')
		b = appendJSONString(b, descs[i].Value)
		b = append(b, ']')
	}
	b = append(b, ']')
	o.end(b, kind)
}

// WriteAdmin writes the line of an admin change: every one is written.
func (o *Observer) WriteAdmin(who admin.Caller, op string, args json.RawMessage, e *admin.Error) {
	if o.out == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.begin(time.Now(), "admin")
	b = append(b, `,"op":`...)
	b = strconv.AppendQuote(b, op)
	b = append(b, `,"who":`...)
	b = strconv.AppendQuote(b, who.String())
	if json.Valid(args) {
		b = append(b, `,"args":`...)
		b = append(b, args...)
	}
	b = append(b, `,"ok":`...)
	b = strconv.AppendBool(b, e == nil)
	if e != nil {
		b = append(b, `,"error":`...)
		b = strconv.AppendQuote(b, e.Error())
	}
	o.end(b, "admin")
}

// WriteConfig writes the line of a configuration (re)load: a change of
// every rule at once.
func (o *Observer) WriteConfig(hash, path string, rules int) {
	if o.out == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	b := o.begin(time.Now(), "config")
	b = append(b, `,"hash":"`...)
	b = append(b, hash...)
	b = append(b, `","path":`...)
	b = strconv.AppendQuote(b, path)
	b = append(b, `,"rules":`...)
	b = strconv.AppendInt(b, int64(rules), 10)
	o.end(b, "config")
}

// begin starts a line in o.buf; o.mu is held.
func (o *Observer) begin(now time.Time, kind string) []byte {
	b := append(o.buf[:0], `{"time":"`...)
	b = now.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","daemon":`...)
	b = strconv.AppendQuote(b, o.id)
	b = append(b, `,"kind":"`...)
	b = append(b, kind...)
	b = append(b, '"')
	return b
}

// end finishes and writes the line; o.mu is held.
func (o *Observer) end(b []byte, kind string) {
	b = append(b, "}\n"...)
	o.buf = b
	if _, err := o.out.Write(b); err != nil {
		decisionErrors.Inc()
		return
	}
	decisionLines[kind].Inc()
}

// appendJSONString appends s as a JSON string. strconv.Quote's escapes
// are not all JSON's (\x00), so bytes outside printable ASCII are written
// as \u00XX.
func appendJSONString(b, s []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, c := range s {
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c >= 0x7f:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// Top answers the admin op top with this daemon's denials.
func (o *Observer) Top(p *policy.Policy, args admin.TopArgs) (admin.TopResult, error) {
	tops := *o.tops.Load()
	res := admin.TopResult{Rules: []admin.RuleTop{}}
	if args.Rule != "" {
		known := false
		for _, r := range p.Rules() {
			known = known || r.Name == args.Rule
		}
		if !known && tops[args.Rule] == nil {
			return res, admin.Errorf(admin.CodeNotFound, "no rule %q", args.Rule)
		}
	}
	for _, r := range p.Rules() {
		if args.Rule != "" && r.Name != args.Rule {
			continue
		}
		rt := admin.RuleTop{Rule: r.Name, Keys: []admin.KeyCount{}}
		if s := tops[r.Name]; s != nil {
			entries, total := s.Top(args.N)
			rt.Denied = total
			for _, e := range entries {
				rt.Keys = append(rt.Keys, admin.KeyCount{Key: e.Key, Count: e.Count, Error: e.Error})
			}
		}
		if args.Rule != "" || rt.Denied > 0 {
			res.Rules = append(res.Rules, rt)
		}
	}
	return res, nil
}

// ID is the daemon's id that o writes in every line and reports top
// under.
func (o *Observer) ID() string { return o.id }

// LinesWritten is the count of decision log lines of kind written (denied,
// allowed, admin, config) by every Observer of the process: the series
// rld_decision_log_lines_total{kind="…"}.
func LinesWritten(kind string) uint64 { return decisionLines[kind].Get() }
