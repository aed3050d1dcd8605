package daemon

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rld/rld/breaker"
	"github.com/rld/rld/buildinfo"
	"github.com/rld/rld/decisions"
	"github.com/rld/rld/derive"
	"github.com/rld/rld/descriptor"
	"github.com/rld/rld/header"
	"github.com/rld/rld/policy"
)

// httpScratch holds one HTTP check's reusable buffers.
type httpScratch struct {
	descs  []descriptor.Descriptor
	in     []descriptor.Descriptor // descs and a request's attributes
	avals  []byte                  // the attributes' values
	ds     derive.Scratch
	sc     policy.Scratch
	fields []header.Field
	vals   []byte
	body   []byte
	os     decisions.Scratch
	lease  []byte // an acquire's lease, for its answer
}

var httpScratchPool = sync.Pool{New: func() any {
	return &httpScratch{descs: make([]descriptor.Descriptor, 0, descriptor.MaxDescriptors)}
}}

func (d *Daemon) newHTTPServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            d.serveHTTP,
		Name:               "rld",
		ReadTimeout:        10 * time.Second,
		WriteTimeout:       10 * time.Second,
		IdleTimeout:        time.Minute,
		MaxRequestBodySize: 1 << 10,
		// Room for every header field nginx passes on by default (four
		// buffers of 8 KiB) twice over: a request's own large headers
		// must not turn a check into an error, which auth_request
		// would serve as rld being down.
		ReadBufferSize:        maxHTTPHeaders,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// Keep the canonical spelling X-RateLimit-*, which operators grep for.
		DisableHeaderNamesNormalizing: true,
	}
}

func (d *Daemon) serveHTTP(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v1/check", "/v1/auth", "/v1/acquire":
		d.serveCheck(ctx)
	case "/v1/release", "/v1/settle":
		d.serveRelease(ctx)
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		writeMetrics(ctx)
	case "/healthz":
		ctx.SetContentType("application/json")
		if d.draining.Load() {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"status":"draining"}` + "\n")
			return
		}
		ctx.SetBody(d.health())
	default:
		httpError(ctx, fasthttp.StatusNotFound, "NOT_FOUND", "no such endpoint; try /v1/check, /metrics or /healthz")
	}
}

// Health is the body of /healthz (HTTP 200): Status is "ok", or
// "degraded" while a circuit breaker of the Redis store is not closed
// (calls to a node are refused or only probing, and the rules follow
// their fail modes) or fail modes decide checks (Fallback), when checks
// still get answers. Redis is set only
// with the Redis store.
type Health struct {
	// Status is "ok" or "degraded".
	Status string `json:"status"`
	// Version and Commit say which build answers (see package buildinfo).
	Version string `json:"version"`
	Commit  string `json:"commit"`
	// Redis describes the Redis store; nil with the embedded store.
	Redis *RedisHealth `json:"redis,omitempty"`
	// Config is the configuration file in force.
	Config *ConfigHealth `json:"config,omitempty"`
}

// ConfigHealth is the Config part of Health: which configuration is in
// force, so that a rollout can be followed daemon by daemon.
type ConfigHealth struct {
	// Hash is ConfigHash of the file's bytes.
	Hash string `json:"hash"`
	// LoadedAt is when it was loaded.
	LoadedAt time.Time `json:"loaded_at"`
}

// RedisHealth is the Redis part of Health.
type RedisHealth struct {
	// Daemons is the number of live daemons on the Redis at the last
	// heartbeat that reached it: the divisor of the fair share of
	// fail-open rules during an outage.
	Daemons int `json:"daemons"`
	// Breakers is the state of each circuit breaker, by node.
	Breakers []BreakerHealth `json:"breakers"`
	// Fallback is true while fail modes decide checks: within the last
	// second, a fail-open rule decided one on local state, or a
	// fail-closed rule refused one because Redis failed.
	Fallback bool `json:"fallback"`
}

// BreakerHealth is the state of one circuit breaker of the Redis store.
type BreakerHealth struct {
	// Node is the Redis node (host:port, "sentinel:<master set>", or
	// "cluster:unmapped-slots").
	Node string `json:"node"`
	// State is "closed", "open" or "half-open".
	State string `json:"state"`
	// RetryAt is when an open breaker lets its next probe go.
	RetryAt *time.Time `json:"retry_at,omitempty"`
}

// health returns the body of /healthz.
func (d *Daemon) health() []byte {
	bi := buildinfo.Get()
	h := Health{Status: "ok", Version: bi.Version, Commit: bi.Commit}
	if lc := d.loaded(); lc != nil {
		h.Config = &ConfigHealth{Hash: lc.hash, LoadedAt: lc.at}
	}
	if f := d.fleet; f != nil {
		rh := &RedisHealth{Daemons: f.Peers(), Fallback: f.fallback.Active(), Breakers: []BreakerHealth{}}
		if rh.Fallback {
			h.Status = "degraded" // answers decided on local state, before a breaker opened too
		}
		for _, b := range f.c.Breakers() {
			bh := BreakerHealth{Node: b.Node, State: b.State.String()}
			if b.State != breaker.Closed {
				h.Status = "degraded"
				at := b.RetryAt
				bh.RetryAt = &at
			}
			rh.Breakers = append(rh.Breakers, bh)
		}
		h.Redis = rh
	}
	b, _ := json.Marshal(h) // plain data always marshals
	return append(b, '\n')
}

// serveCheck answers GET /v1/check?name=value&…&cost=N&peek=1. Every query
// argument other than cost and peek is a descriptor, in query order. A
// query with malformed percent-encoding is refused, as are a cost that is
// not a whole number up to 2^32−1 (0 means 1, as on the wire) and a peek
// other than 1, true, 0 or false.
func (d *Daemon) serveCheck(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() && !ctx.IsPost() {
		httpError(ctx, fasthttp.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "use GET")
		return
	}
	httpChecks.Inc()
	now := time.Now()
	s := httpScratchPool.Get().(*httpScratch)
	defer httpScratchPool.Put(s)
	s.descs, s.avals = s.descs[:0], s.avals[:0]
	cost := int64(1)
	peek := false
	var bad string
	// fasthttp decodes leniently, taking a bad escape literally: %zz and
	// %25zz would share a counter.
	if i := badPercent(ctx.URI().QueryString()); i >= 0 {
		bad = "malformed percent-encoding in the query at byte " + strconv.Itoa(i)
	}
	var seenCost, seenPeek bool
	for key, value := range ctx.QueryArgs().All() {
		switch string(key) {
		case "cost":
			if seenCost {
				bad = "cost is given twice: give it once"
			}
			seenCost = true
			n, err := strconv.ParseUint(string(value), 10, 32)
			if err != nil {
				bad = "cost must be a whole number from 0 to 4294967295 (0 means 1), got " + strconv.Quote(string(value))
			}
			cost = max(int64(n), 1)
		case "peek":
			if seenPeek {
				bad = "peek is given twice: give it once"
			}
			seenPeek = true
			switch string(value) {
			case "1", "true":
				peek = true
			case "0", "false":
				peek = false
			default:
				bad = "peek must be 1, true, 0 or false, got " + strconv.Quote(string(value))
			}
		default:
			switch {
			case len(s.descs) == descriptor.MaxDescriptors:
				bad = "too many descriptors (at most " + strconv.Itoa(descriptor.MaxDescriptors) + ")"
			case len(key) == 0 || len(key) > descriptor.MaxNameLen:
				bad = "descriptor name empty or longer than " + strconv.Itoa(descriptor.MaxNameLen) + " bytes"
			case len(value) > descriptor.MaxValueLen:
				// A long value is replaced by its digest, as the
				// clients send it: never refused.
				start := len(s.avals)
				s.avals = derive.AppendValue(s.avals, value, derive.MaxValue)
				s.descs = append(s.descs, descriptor.Descriptor{Name: key, Value: s.avals[start:len(s.avals):len(s.avals)]})
			default:
				s.descs = append(s.descs, descriptor.Descriptor{Name: key, Value: value})
			}
		}
	}
	attrs := false
	if bad == "" {
		attrs, bad = d.addAttributes(ctx, s)
	}
	if bad == "" && !attrs {
		bad = d.addClientIP(ctx, s)
	}
	if bad != "" {
		httpRejected.Inc()
		httpError(ctx, fasthttp.StatusBadRequest, "BAD_REQUEST", bad)
		return
	}
	live := d.live.Load() // the policy and deriver of one configuration
	p := live.policy
	var dec policy.Decision
	s.lease = nil
	descs := s.descs
	if attrs {
		r := live.deriver.Derive(s.in, now, &s.ds)
		descs = r.Descs
		if r.Oversize {
			dec = oversizeDecision
			d.ops.obs.Observe(p, &dec, descs, now, &s.os)
			d.writeAnswer(ctx, s, now, &dec)
			return
		}
	}
	if string(ctx.Path()) == "/v1/acquire" {
		if peek {
			httpRejected.Inc()
			httpError(ctx, fasthttp.StatusBadRequest, "BAD_REQUEST", "an acquire cannot peek")
			return
		}
		s.lease = p.AcquireTo(context.Background(), &policy.Request{Now: now, Descs: descs, Cost: cost}, &s.sc, &dec)
	} else {
		dec = p.Check(context.Background(), &policy.Request{Now: now, Descs: descs, Cost: cost, Peek: peek}, &s.sc)
	}
	if !peek {
		d.ops.obs.Observe(p, &dec, descs, now, &s.os)
	}
	d.writeAnswer(ctx, s, now, &dec)
	httpCheckDuration.UpdateDuration(now)
}

// writeAnswer writes dec as /v1/auth or as /v1/check and /v1/acquire
// answer it.
func (d *Daemon) writeAnswer(ctx *fasthttp.RequestCtx, s *httpScratch, now time.Time, dec *policy.Decision) {
	if string(ctx.Path()) == "/v1/auth" {
		d.writeAuth(ctx, s, now, dec)
	} else {
		d.writeDecision(ctx, s, now, dec)
	}
}

// serveRelease answers GET or POST /v1/release?lease=LEASE: it gives
// back the concurrency slots of a lease that /v1/acquire (or an ACQUIRE
// on the socket) returned; and /v1/settle?lease=LEASE&cost=N, which
// settles it at its actual cost N (0 means 1). 200 when released or
// settled, 404 UNKNOWN_LEASE when the lease holds nothing any more
// (released or settled already, or expired), 400 when it does not parse.
func (d *Daemon) serveRelease(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsPost() {
		httpError(ctx, fasthttp.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "use GET or POST")
		return
	}
	settle := string(ctx.Path()) == "/v1/settle"
	args := ctx.QueryArgs()
	lease := args.Peek("lease")
	want, cost := 1, uint64(0)
	if settle {
		want = 2
		var err error
		if cost, err = strconv.ParseUint(string(args.Peek("cost")), 10, 32); err != nil {
			httpRejected.Inc()
			httpError(ctx, fasthttp.StatusBadRequest, "BAD_REQUEST", "cost must be a whole number from 0 to 4294967295 (0 means 1), got "+strconv.Quote(string(args.Peek("cost"))))
			return
		}
	}
	if len(lease) == 0 || len(lease) > policy.MaxLeaseLen || args.Len() != want {
		httpRejected.Inc()
		httpError(ctx, fasthttp.StatusBadRequest, "BAD_REQUEST", "want the query arguments lease (1 to "+strconv.Itoa(policy.MaxLeaseLen)+" bytes), and cost for /v1/settle, only")
		return
	}
	now := time.Now()
	s := httpScratchPool.Get().(*httpScratch)
	defer httpScratchPool.Put(s)
	s.lease = nil
	var dec policy.Decision
	if settle {
		dec = d.pol().Settle(context.Background(), now, lease, int64(cost))
	} else {
		dec = d.pol().Release(context.Background(), now, lease)
	}
	d.writeDecision(ctx, s, now, &dec)
}

// badPercent returns the offset of the first '%' in the raw query q that
// is not followed by two hex digits, or -1.
func badPercent(q []byte) int {
	for i := 0; i < len(q); i++ {
		if q[i] == '%' && (i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2])) {
			return i
		}
	}
	return -1
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// setDecisionHeaders sets the rate-limit header fields of dec, as
// /v1/check and /v1/auth both send them, and returns the answer they
// were rendered from.
func setDecisionHeaders(ctx *fasthttp.RequestCtx, s *httpScratch, now time.Time, dec *policy.Decision) header.Answer {
	a := answerOf(dec)
	s.fields, s.vals = header.AppendFields(s.fields[:0], s.vals[:0], a, now)
	for _, f := range s.fields {
		ctx.Response.Header.SetBytesV(f.Name, f.Value)
	}
	ctx.Response.Header.Set("X-RateLimit-Decision", dec.Status.String())
	if dec.Degraded {
		// Decided by the rule's fail mode: the shared store failed.
		ctx.Response.Header.Set("X-RateLimit-Policy", "degraded")
	}
	return a
}

func (d *Daemon) writeDecision(ctx *fasthttp.RequestCtx, s *httpScratch, now time.Time, dec *policy.Decision) {
	a := setDecisionHeaders(ctx, s, now, dec)
	switch dec.Status {
	case policy.StatusAllowed, policy.StatusAllowedDegraded:
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("application/json")
		if len(s.lease) > 0 {
			// The lease is base64url: it needs no escaping.
			ctx.Response.Header.SetBytesV("X-RateLimit-Lease", s.lease)
			b := append(s.body[:0], `{"decision":"`...)
			b = append(b, dec.Status.String()...)
			b = append(b, `","lease":"`...)
			b = append(b, s.lease...)
			b = append(b, "\"}\n"...)
			s.body = b
			ctx.SetBody(b)
			return
		}
		ctx.SetBodyString(`{"decision":"` + dec.Status.String() + `"}` + "\n")
	case policy.StatusLimited:
		ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
		ctx.SetContentType("application/json")
		b := s.body[:0]
		b = append(b, `{"error":{"code":"RATE_LIMIT_EXCEEDED","message":`...)
		b = strconv.AppendQuote(b, "rate limit "+strconv.Quote(dec.Rule)+" exceeded; retry after "+strconv.FormatInt(header.Seconds(a.Retry), 10)+"s")
		b = append(b, `,"details":{"rule":`...)
		b = strconv.AppendQuote(b, dec.Rule)
		b = append(b, `,"limit":`...)
		b = strconv.AppendUint(b, a.Limit, 10)
		b = append(b, `,"window_seconds":`...)
		b = strconv.AppendInt(b, header.Seconds(a.Window), 10)
		b = append(b, `,"retry_after_seconds":`...)
		b = strconv.AppendInt(b, max(1, header.Seconds(a.Retry)), 10)
		b = append(b, `,"reset_at":`...)
		b = strconv.AppendInt(b, now.Add(a.Reset).Add(time.Second-1).Unix(), 10)
		b = append(b, "}}}\n"...)
		s.body = b
		ctx.SetBody(b)
	case policy.StatusBlocked:
		msg := "request blocked by the deny list"
		if dec.Rule != policy.RuleDeny {
			msg = "request blocked: its key is blocked for rule " + strconv.Quote(dec.Rule)
		}
		httpError(ctx, fasthttp.StatusForbidden, "BLOCKED", msg)
	default:
		status, code := fasthttp.StatusInternalServerError, "INTERNAL"
		switch dec.Code {
		case policy.CodeCostTooLarge:
			status, code = fasthttp.StatusBadRequest, "COST_TOO_LARGE"
		case policy.CodeNotFound:
			status, code = fasthttp.StatusNotFound, "UNKNOWN_LEASE"
		case policy.CodeMalformed:
			status, code = fasthttp.StatusBadRequest, "BAD_REQUEST"
		}
		msg := dec.Code.String()
		if dec.Err != nil {
			msg = dec.Err.Error()
		}
		httpError(ctx, status, code, msg)
	}
}

// httpError writes a JSON error body.
func httpError(ctx *fasthttp.RequestCtx, status int, code, msg string) {
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	b := append([]byte(`{"error":{"code":"`), code...)
	b = append(b, `","message":`...)
	m, _ := json.Marshal(msg) // a string always marshals
	b = append(b, m...)
	b = append(b, "}}\n"...)
	ctx.SetBody(b)
}
