package daemon

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/valyala/fasthttp"

	"github.com/rld/rld/header"
	"github.com/rld/rld/policy"
	"github.com/rld/rld/wire"
)

// httpScratch holds one HTTP check's reusable buffers.
type httpScratch struct {
	descs  []wire.Descriptor
	sc     policy.Scratch
	fields []header.Field
	vals   []byte
	body   []byte
}

var httpScratchPool = sync.Pool{New: func() any {
	return &httpScratch{descs: make([]wire.Descriptor, 0, wire.MaxDescriptors)}
}}

func (d *Daemon) newHTTPServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:               d.serveHTTP,
		Name:                  "rld",
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          10 * time.Second,
		IdleTimeout:           time.Minute,
		MaxRequestBodySize:    1 << 10,
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		// Keep the canonical spelling X-RateLimit-*, which operators grep for.
		DisableHeaderNamesNormalizing: true,
	}
}

func (d *Daemon) serveHTTP(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v1/check":
		d.serveCheck(ctx)
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		metrics.WritePrometheus(ctx, true)
	case "/healthz":
		ctx.SetContentType("application/json")
		if d.draining.Load() {
			ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
			ctx.SetBodyString(`{"status":"draining"}` + "\n")
			return
		}
		ctx.SetBodyString(`{"status":"ok"}` + "\n")
	default:
		httpError(ctx, fasthttp.StatusNotFound, "NOT_FOUND", "no such endpoint; try /v1/check, /metrics or /healthz")
	}
}

// serveCheck answers GET /v1/check?name=value&…&cost=N&peek=1. Every query
// argument other than cost and peek is a descriptor, in query order.
func (d *Daemon) serveCheck(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() && !ctx.IsPost() {
		httpError(ctx, fasthttp.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "use GET")
		return
	}
	httpChecks.Inc()
	now := time.Now()
	s := httpScratchPool.Get().(*httpScratch)
	defer httpScratchPool.Put(s)
	s.descs = s.descs[:0]
	cost := int64(1)
	peek := false
	var bad string
	for key, value := range ctx.QueryArgs().All() {
		switch string(key) {
		case "cost":
			n, err := strconv.ParseUint(string(value), 10, 32)
			if err != nil || n == 0 {
				bad = "cost must be a whole number from 1 to 4294967295, got " + strconv.Quote(string(value))
			}
			cost = int64(n)
		case "peek":
			peek = string(value) == "1" || string(value) == "true"
		default:
			switch {
			case len(s.descs) == wire.MaxDescriptors:
				bad = "too many descriptors (at most " + strconv.Itoa(wire.MaxDescriptors) + ")"
			case len(key) == 0 || len(key) > wire.MaxNameLen:
				bad = "descriptor name empty or longer than " + strconv.Itoa(wire.MaxNameLen) + " bytes"
			case len(value) > wire.MaxValueLen:
				bad = "descriptor " + strconv.Quote(string(key)) + " longer than " + strconv.Itoa(wire.MaxValueLen) + " bytes"
			default:
				s.descs = append(s.descs, wire.Descriptor{Name: key, Value: value})
			}
		}
	}
	if bad != "" {
		countFrameError(wire.CodeMalformed)
		httpError(ctx, fasthttp.StatusBadRequest, "BAD_REQUEST", bad)
		return
	}
	dec := d.policy.Load().Check(context.Background(), now, s.descs, cost, peek, &s.sc)
	d.writeDecision(ctx, s, now, &dec)
}

func (d *Daemon) writeDecision(ctx *fasthttp.RequestCtx, s *httpScratch, now time.Time, dec *policy.Decision) {
	a := header.Answer{
		Rule:      dec.Rule,
		Limit:     uint64(max(dec.Result.Limit, 0)),
		Remaining: uint64(max(dec.Result.Remaining, 0)),
		Window:    dec.Period,
		Reset:     dec.Result.Reset,
	}
	if dec.Status == wire.StatusLimited {
		a.Retry = max(dec.Result.RetryAfter, time.Millisecond)
	}
	s.fields, s.vals = header.AppendFields(s.fields[:0], s.vals[:0], a, now)
	for _, f := range s.fields {
		ctx.Response.Header.SetBytesV(f.Name, f.Value)
	}
	ctx.Response.Header.Set("X-RateLimit-Decision", dec.Status.String())
	switch dec.Status {
	case wire.StatusAllowed, wire.StatusAllowedDegraded:
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"decision":"` + dec.Status.String() + `"}` + "\n")
	case wire.StatusLimited:
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
	case wire.StatusBlocked:
		httpError(ctx, fasthttp.StatusForbidden, "BLOCKED", "request blocked by the deny list")
	default:
		status, code := fasthttp.StatusInternalServerError, "INTERNAL"
		switch dec.Code {
		case wire.CodeCostTooLarge, wire.CodeBadCost:
			status, code = fasthttp.StatusBadRequest, "COST_TOO_LARGE"
		case wire.CodeUnavailable:
			status, code = fasthttp.StatusServiceUnavailable, "UNAVAILABLE"
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
