package daemon

import (
	"strconv"

	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/buildinfo"
	"github.com/rld/rld/wire"
)

// checkBuckets are the upper bounds (seconds) of rld_check_duration_seconds:
// a check takes microseconds, so the buckets are dense below 1 ms (the p99
// alert's threshold is a bound) and sparse up to a second.
var checkBuckets = []float64{
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1,
}

var (
	connsOpen     = metrics.NewGauge(`rld_connections_open`, nil)
	connsAccepted = metrics.NewCounter(`rld_connections_accepted_total`)
	connsRejected = metrics.NewCounter(`rld_connections_rejected_total`)
	framesServed  = metrics.NewCounter(`rld_frames_total`)
	// checkDuration is a Prometheus histogram (le buckets), which
	// histogram_quantile reads; its Update takes a lock and allocates
	// nothing.
	checkDuration = metrics.NewPrometheusHistogramExt(`rld_check_duration_seconds`, checkBuckets)
	httpChecks    = metrics.NewCounter(`rld_http_checks_total`)
	// httpRejected counts the HTTP check requests refused with 400.
	httpRejected = metrics.NewCounter(`rld_http_rejected_total`)
	// httpCheckDuration is rld_check_duration_seconds's counterpart for
	// the HTTP checks.
	httpCheckDuration = metrics.NewPrometheusHistogramExt(`rld_http_check_duration_seconds`, checkBuckets)

	reloadsOK     = metrics.NewCounter(`rld_config_reloads_total{result="success"}`)
	reloadsFailed = metrics.NewCounter(`rld_config_reloads_total{result="failure"}`)
	// lastReloadOK is 1 once the configuration loaded and while the last
	// reload succeeded, 0 after a failed one.
	lastReloadOK = metrics.NewGauge(`rld_config_last_reload_successful`, nil)
	livePeers    = metrics.NewGauge(`rld_fleet_daemons`, nil)

	// frameErrors counts rejected frames by error code: one series per
	// code the protocol names (none for CodeNone).
	frameErrors = func() (c [wire.CodeNotFound + 1]*metrics.Counter) {
		for i := wire.CodeNone + 1; i < wire.Code(len(c)); i++ {
			c[i] = metrics.NewCounter(`rld_frame_errors_total{code="` + i.String() + `"}`)
		}
		return c
	}()

	// rld_build_info{version,commit,goversion} is always 1: its labels
	// say what runs.
	_ = func() *metrics.Gauge {
		bi := buildinfo.Get()
		return metrics.NewGauge(`rld_build_info{version=`+strconv.Quote(bi.Version)+
			`,commit=`+strconv.Quote(bi.Commit)+`,goversion=`+strconv.Quote(bi.GoVersion)+`}`,
			func() float64 { return 1 })
	}()
)

func init() {
	// Write # HELP and # TYPE lines, which Prometheus and promtool expect.
	metrics.ExposeMetadata(true)
}

func countFrameError(code wire.Code) {
	if int(code) < len(frameErrors) && frameErrors[code] != nil {
		frameErrors[code].Inc()
	}
}
