package daemon_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon"
)

// TestMetricsForPrometheus: /metrics says what Prometheus needs to read
// it as it expects: # TYPE lines, the check latency as a histogram with
// le buckets, gauges typed as gauges, rld_config_last_reload_successful 1
// after the first load, and rld_build_info; /healthz names the build.
func TestMetricsForPrometheus(t *testing.T) {
	s := start(t, testConfig)
	c := client.New(s.Socket)
	t.Cleanup(func() { c.Close() })
	for range 5 {
		_, err := c.Check(context.Background(), search("sk_metrics"), 1)
		require.NoError(t, err)
	}

	resp, err := http.Get("http://" + s.HTTP + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := string(body)
	for _, line := range []string{
		"# TYPE rld_check_duration_seconds histogram",
		"# TYPE rld_connections_open gauge",
		"# TYPE rld_config_last_reload_successful gauge",
		"# TYPE rld_fleet_daemons gauge",
		"# TYPE rld_build_info gauge",
		"# TYPE rld_checks_total counter",
		"rld_config_last_reload_successful 1",
	} {
		assert.Contains(t, strings.Split(m, "\n"), line)
	}
	assert.Regexp(t, `(?m)^rld_check_duration_seconds_bucket\{le="0\.001"\} [1-9]`, m, "the 1 ms bucket counts the checks")
	assert.Regexp(t, `(?m)^rld_check_duration_seconds_bucket\{le="\+Inf"\} [1-9]`, m)
	assert.Regexp(t, `(?m)^rld_check_duration_seconds_count [1-9]`, m)
	assert.NotContains(t, m, `rld_check_duration_seconds_bucket{vmrange`)
	for _, line := range strings.Split(m, "\n") {
		if name, ok := strings.CutPrefix(line, "# HELP "); ok {
			assert.Contains(t, name, " ", "a help text for %s", name)
			if strings.HasPrefix(name, "rld_") {
				assert.NotContains(t, name, "; see docs/operations.md.", "an rld metric has its own help text in metricHelp")
			}
		}
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			parts := strings.Fields(f)
			require.Len(t, parts, 2, line)
			assert.Equal(t, parts[1] == "counter", strings.HasSuffix(parts[0], "_total"),
				"a counter, and only a counter, is named *_total: %s", line)
		}
	}
	assert.Contains(t, m, "# HELP rld_checks_total Checks by the rule that decided")
	assert.Regexp(t, `(?m)^rld_build_info\{version="[^"]+",commit="[^"]+",goversion="go[^"]+"\} 1$`, m)

	resp, err = http.Get("http://" + s.HTTP + "/healthz")
	require.NoError(t, err)
	defer resp.Body.Close()
	var h daemon.Health
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&h))
	assert.Equal(t, "ok", h.Status)
	assert.NotEmpty(t, h.Version)
	assert.NotEmpty(t, h.Commit)
}

// TestWatchdogPings: under a unit with WatchdogSec= (systemd sets
// NOTIFY_SOCKET and WATCHDOG_USEC) the daemon sends READY=1 and then
// WATCHDOG=1 at half the interval, read here from a notify socket of the
// test's own; STOPPING=1 when it stops.
func TestWatchdogPings(t *testing.T) {
	dir := t.TempDir()
	addr := &net.UnixAddr{Name: filepath.Join(dir, "notify.sock"), Net: "unixgram"}
	notify, err := net.ListenUnixgram("unixgram", addr)
	require.NoError(t, err)
	t.Cleanup(func() { notify.Close() })
	t.Setenv("NOTIFY_SOCKET", addr.Name)
	t.Setenv("WATCHDOG_USEC", "100000") // 100 ms: a ping every 50 ms

	s := start(t, testConfig)
	read := func() string {
		t.Helper()
		buf := make([]byte, 4096)
		require.NoError(t, notify.SetReadDeadline(time.Now().Add(10*time.Second)))
		n, err := notify.Read(buf)
		require.NoError(t, err, "a notification within 10 s")
		return string(buf[:n])
	}
	assert.Equal(t, "READY=1", read())
	for range 3 {
		assert.Equal(t, "WATCHDOG=1", read())
	}
	require.NoError(t, s.Stop())
	for {
		msg := read()
		if msg == "STOPPING=1" {
			break
		}
		assert.Equal(t, "WATCHDOG=1", msg, "only pings before STOPPING=1")
	}
}
