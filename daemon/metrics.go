package daemon

import (
	"github.com/VictoriaMetrics/metrics"

	"github.com/rld/rld/wire"
)

var (
	connsOpen     = metrics.NewCounter(`rld_connections_open`)
	connsAccepted = metrics.NewCounter(`rld_connections_accepted_total`)
	connsRejected = metrics.NewCounter(`rld_connections_rejected_total`)
	framesServed  = metrics.NewCounter(`rld_frames_total`)
	checkDuration = metrics.NewHistogram(`rld_check_duration_seconds`)
	httpChecks    = metrics.NewCounter(`rld_http_checks_total`)

	reloadsOK     = metrics.NewCounter(`rld_config_reloads_total{result="success"}`)
	reloadsFailed = metrics.NewCounter(`rld_config_reloads_total{result="failure"}`)
	lastReloadOK  = metrics.NewCounter(`rld_config_last_reload_successful`)
	livePeers     = metrics.NewCounter(`rld_fleet_daemons`)

	// frameErrors counts rejected frames by error code.
	frameErrors = func() (c [16]*metrics.Counter) {
		for i := range c {
			c[i] = metrics.NewCounter(`rld_frame_errors_total{code="` + wire.Code(i).String() + `"}`)
		}
		return c
	}()
)

func countFrameError(code wire.Code) {
	if int(code) < len(frameErrors) {
		frameErrors[code].Inc()
	}
}
