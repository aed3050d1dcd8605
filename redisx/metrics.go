package redisx

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/algo"
	"github.com/rld/rld/breaker"
)

// opMetrics counts the calls of one op by result and times them.
type opMetrics struct {
	ok, timeout, failed, refused *metrics.Counter
	duration                     *metrics.PrometheusHistogram
}

// callBuckets are the upper bounds (seconds) of
// rld_redis_call_duration_seconds, a Prometheus histogram (le buckets).
var callBuckets = []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1}

var (
	// callMetrics: rld_redis_calls_total{op,result} and
	// rld_redis_call_duration_seconds{op}.
	// The op label is the op's name (algo.OpInfo.Name).
	callMetrics = func() (m [algo.NumOpKinds]opMetrics) {
		for k := range algo.NumOpKinds {
			name := k.String()
			m[k] = opMetrics{
				ok:       metrics.NewCounter(`rld_redis_calls_total{op="` + name + `",result="ok"}`),
				timeout:  metrics.NewCounter(`rld_redis_calls_total{op="` + name + `",result="timeout"}`),
				failed:   metrics.NewCounter(`rld_redis_calls_total{op="` + name + `",result="error"}`),
				refused:  metrics.NewCounter(`rld_redis_calls_total{op="` + name + `",result="breaker_open"}`),
				duration: metrics.NewPrometheusHistogramExt(`rld_redis_call_duration_seconds{op="`+name+`"}`, callBuckets),
			}
		}
		return m
	}()
	// connectErrors counts failed attempts to connect a Client.
	connectErrors = metrics.NewCounter(`rld_redis_connect_errors_total`)
	// slotRefreshErrors counts Cluster slot map refreshes that failed.
	slotRefreshErrors = metrics.NewCounter(`rld_redis_slot_refresh_errors_total`)
	// redirections counts the Cluster calls (or a batch's ops) that the
	// node the slot map named answered MOVED or ASK.
	redirections = metrics.NewCounter(`rld_redis_redirections_total`)
)

// record counts one call of an op of kind k that started at start and
// ended with err: result "ok", "timeout", "error", or "breaker_open" for a
// call its breaker refused (not sent, not timed).
func record(k algo.OpKind, start time.Time, err error) {
	m := &callMetrics[k]
	if err != nil && errors.Is(err, breaker.ErrOpen) {
		m.refused.Inc()
		return
	}
	m.duration.UpdateDuration(start)
	switch {
	case err == nil:
		m.ok.Inc()
	case IsTimeout(err):
		m.timeout.Inc()
	default:
		m.failed.Inc()
	}
}

// IsTimeout reports whether err is a deadline that passed, the call's or
// the connection's: a call that timed out may still have reached Redis.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
