package daemon_test

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
)

// redisCallCounts sums d's rld_redis_calls_total over every op, by
// result, and rld_redis_breaker_transitions_total{to="open"} over every
// node (as "opened").
func redisCallCounts(t *testing.T, d *daemontest.Server) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.HTTP + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "rld_redis_calls_total{"):
			_, result, _ := strings.Cut(name, `result="`)
			out[strings.TrimSuffix(result, `"}`)] += v
		case strings.HasPrefix(name, "rld_redis_breaker_transitions_total{") && strings.Contains(name, `to="open"`):
			out["opened"] += v
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// TestFailRedisBusy: a healthy Redis that is now and then busy for longer
// than store.timeout (a script spinning 300 ms, 8 times) under steady
// strict checks: the checks whose Redis calls time out are answered by
// the fail mode (degraded), the others by Redis, and the breaker stays
// closed, so there are no more degraded answers than failed calls and
// none refused by the breaker.
func TestFailRedisBusy(t *testing.T) {
	srv := redistest.Standalone(t)
	// Long enough that this loaded machine's own stalls rarely outlast it.
	const timeout, stall = 100 * time.Millisecond, 300 * time.Millisecond
	d := startFailDaemon(t, srv.Addr, timeout)
	l := startLoad(d.Socket, "strict", 8)
	l.wait(t, "normal answers before the stalls", &l.normal, 300)
	before := redisCallCounts(t, d)
	degraded := l.degraded.Load()
	for range 8 {
		srv.Busy(t, stall)
		l.wait(t, "normal answers after a stall", &l.normal, 200)
	}
	degraded = l.degraded.Load() - degraded
	after := redisCallCounts(t, d)
	l.finish()
	delta := func(k string) float64 { return after[k] - before[k] }
	t.Logf("stalls of %v, store.timeout %v: %v calls ok, %v timed out, %v failed, %v refused; %d answers degraded, %d errors",
		stall, timeout, delta("ok"), delta("timeout"), delta("error"), delta("breaker_open"), degraded, l.errs.Load())
	assert.Positive(t, delta("timeout"), "the stalls time calls out")
	assert.LessOrEqual(t, float64(degraded), delta("timeout")+delta("error"), "no more degraded answers than failed calls")
	assert.Zero(t, delta("breaker_open"), "no call refused by the breaker")
	assert.Zero(t, delta("opened"), "the breaker never opened")
	assert.Zero(t, l.errs.Load())
}
