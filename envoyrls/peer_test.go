package envoyrls_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/envoyrls"
	"github.com/rld/rld/redistest"
)

// PeerModule is envoyproxy/ratelimit at the version whose test cases
// TestReplayPeerIntegration replays (and bench/envoy builds).
const PeerModule = "github.com/envoyproxy/ratelimit@v1.4.1-0.20260122083618-3fb702589d36"

// peerDir returns the peer's source directory in the module cache,
// downloading it through the module proxy if need be; it skips the test
// when neither has it.
func peerDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", PeerModule)
	cmd.Dir = t.TempDir() // outside this module: go.mod and go.sum stay as they are
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if err == nil {
		err = json.Unmarshal(out, &info)
	}
	if err != nil || info.Dir == "" {
		t.Skipf("the module cache and proxy do not have %s: %v %s", PeerModule, err, info.Error)
	}
	return info.Dir
}

// peerConfig imports the peer's integration test configuration (its
// runtime/current/ratelimit/config/*.yaml) as rld config import-envoy does.
func peerConfig(t *testing.T, dir string) string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "test/integration/runtime/current/ratelimit/config/*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, names)
	files, err := envoyrls.ReadFiles(names)
	require.NoError(t, err)
	out, err := envoyrls.Import(files)
	require.NoError(t, err)
	return string(out)
}

// TestReplayPeerIntegration replays the descriptor scenarios of
// envoyproxy/ratelimit's test/integration/integration_test.go
// (testBasicBaseConfig with and without its _local keys, and
// testShareThreshold) against rld through gRPC, with the configuration
// that Import makes of the peer's own YAML: the same codes, limits, units,
// remaining counts and durations until reset. The peer's scenario for
// StopCacheKeyIncrementWhenOverlimit and its reload scenario are covered
// by docs/envoy.md's list of differences (the reload file holds a block,
// which Import refuses: asserted below).
func TestReplayPeerIntegration(t *testing.T) {
	dir := peerDir(t)
	clk := newClock()
	c := dial(t, serve(t, peerConfig(t, dir), clk))
	exact := func(t *testing.T, unit, got time.Duration) {
		t.Helper()
		assert.Equal(t, peerReset(clk.now(), unit), got, "duration until reset of a %s window", unit)
	}
	replay(t, c, exact, func(d time.Duration) { clk.add(d) })

	t.Run("reload.yaml refused", func(t *testing.T) {
		path := filepath.Join(dir, "test/integration/runtime/current/ratelimit/reload.yaml")
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		_, err = envoyrls.Import([]envoyrls.File{{Name: "reload.yaml", Data: data}})
		assert.ErrorContains(t, err, "reload.yaml: line 8: domain \"reload\": requests_per_unit 0")
	})
}

// peerReset is envoyproxy/ratelimit's duration until reset at now for a
// window of unit (utils.CalculateReset): the unit less the whole seconds
// since the window, aligned on the epoch, started.
func peerReset(now time.Time, unit time.Duration) time.Duration {
	u := int64(unit / time.Second)
	return time.Duration(u-now.Unix()%u) * time.Second
}

// replay runs the peer's scenarios on c. resetOK judges a duration until
// reset for a window of unit; advance moves the server's clock (nil: the
// scenario that needs it is skipped).
func replay(t *testing.T, c *envoyrls.Client, resetOK func(t *testing.T, unit, got time.Duration), advance func(time.Duration)) {
	ctx := context.Background()
	check := func(domain string, descs [][]envoyrls.Entry) envoyrls.Response {
		t.Helper()
		r, err := c.Check(ctx, domain, descs, 1)
		require.NoError(t, err)
		return r
	}
	units := map[string]time.Duration{"SECOND": time.Second, "MINUTE": time.Minute, "HOUR": time.Hour, "DAY": 24 * time.Hour}
	// eq compares a status with the peer's expectation; the duration
	// until reset goes to resetOK.
	eq := func(t *testing.T, code string, limit uint32, unit string, remaining uint32, got envoyrls.Status, msg string, args ...any) {
		t.Helper()
		reset := got.Reset
		got.Reset = 0
		assert.Equal(t, envoyrls.Status{Code: code, Limit: limit, Unit: unit, Remaining: remaining}, got, append([]any{msg}, args...)...)
		resetOK(t, units[unit], reset)
	}
	for n, suffix := range []string{"", "_local"} {
		t.Run("keys"+suffix, func(t *testing.T) {
			r := check("foo", one("hello"+suffix, "world"))
			assert.Equal(t, envoyrls.Response{Code: "OK", Statuses: []envoyrls.Status{{Code: "OK"}}, Headers: map[string]string{}}, r)

			r = check("basic", one("key1"+suffix, "foo"))
			assert.Equal(t, "OK", r.Code)
			eq(t, "OK", 50, "SECOND", 49, r.Statuses[0], "key1")

			rnd := fmt.Sprint(time.Now().UnixNano() + int64(n))
			for i := range 25 {
				r = check("another", one("key2"+suffix, rnd))
				code, rem := "OK", uint32(20-(i+1))
				if i >= 20 {
					code, rem = "OVER_LIMIT", 0
				}
				assert.Equal(t, code, r.Code, "key2 #%d", i)
				eq(t, code, 20, "MINUTE", rem, r.Statuses[0], "key2 #%d", i)
			}

			rnd = fmt.Sprint(time.Now().UnixNano() + int64(n))
			for i := range 15 {
				r = check("another", [][]envoyrls.Entry{
					{{Key: "key2" + suffix, Value: rnd}}, {{Key: "key3" + suffix, Value: rnd}},
				})
				code, rem2 := "OK", uint32(10-(i+1))
				if i >= 10 {
					code, rem2 = "OVER_LIMIT", 0
				}
				assert.Equal(t, code, r.Code, "key2+key3 #%d", i)
				// The peer's default (no STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT):
				// each descriptor is counted on its own.
				eq(t, "OK", 20, "MINUTE", uint32(20-(i+1)), r.Statuses[0], "key2 #%d", i)
				eq(t, code, 10, "HOUR", rem2, r.Statuses[1], "key3 #%d", i)
			}

			if advance == nil {
				return
			}
			r1 := check("another", one("key4"+suffix, "durTest"))
			eq(t, "OK", 20, "DAY", 19, r1.Statuses[0], "key4")
			advance(2 * time.Second)
			r2 := check("another", one("key4"+suffix, "durTest"))
			assert.Less(t, r2.Statuses[0].Reset, r1.Statuses[0].Reset)
			advance(-2 * time.Second)
		})
	}

	t.Run("share_threshold", func(t *testing.T) {
		const domain = "share-threshold-test"
		for i := range 10 {
			r := check(domain, one("files", fmt.Sprintf("files/%d.pdf", i%2)))
			eq(t, "OK", 10, "HOUR", uint32(9-i), r.Statuses[0], "files #%d", i)
		}
		r := check(domain, one("files", "files/b.csv"))
		assert.Equal(t, "OVER_LIMIT", r.Code)
		eq(t, "OVER_LIMIT", 10, "HOUR", 0, r.Statuses[0], "files/b.csv")
		base := time.Now().UnixNano()
		for i := range 10 {
			r := check(domain, one("files_no_share", fmt.Sprintf("files_no_share/%d-%d", base, i)))
			eq(t, "OK", 10, "HOUR", 9, r.Statuses[0], "files_no_share #%d", i)
		}
	})
}

// TestImportPeerReadmeExamples: every configuration example of the peer's
// README imports, except the two docs/envoy.md lists as differences: a
// block (requests_per_unit: 0, Example 3) and replaces (Example 7).
func TestImportPeerReadmeExamples(t *testing.T) {
	dir := peerDir(t)
	b, err := os.ReadFile(filepath.Join(dir, "README.md"))
	require.NoError(t, err)
	readme := string(b)
	start, end := strings.Index(readme, "#### Example 1\n"), strings.Index(readme, "### File Based Configuration Loading")
	require.True(t, start >= 0 && end > start, "the README's examples")
	sections := regexp.MustCompile(`(?m)^#### Example (\d+)\n`).Split(readme[start:end], -1)[1:]
	require.GreaterOrEqual(t, len(sections), 11)
	yamlBlock := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	imported := 0
	for i, sec := range sections {
		for _, m := range yamlBlock.FindAllStringSubmatch(sec, -1) {
			if !strings.Contains(m[1], "domain:") {
				continue // Envoy's own configuration
			}
			name := fmt.Sprintf("example%d.yaml", i+1)
			_, err := envoyrls.Import([]envoyrls.File{{Name: name, Data: []byte(m[1])}})
			switch i + 1 {
			case 3:
				assert.ErrorContains(t, err, "requests_per_unit 0", name)
			case 7:
				assert.ErrorContains(t, err, "replaces has no rld equivalent", name)
			default:
				if assert.NoError(t, err, name) {
					imported++
				}
			}
		}
	}
	assert.GreaterOrEqual(t, imported, 10)
}

// TestReplayPeerIntegrationRedis replays the same scenarios against an rld
// daemon on Redis, as the peer runs on Redis: the imported configuration
// with a [store] table and its rules strict (decided in Redis on every
// check, as the peer decides; a cached rule's limit_remaining is the
// daemon's view of its leases, seen one off near the limit, see
// docs/envoy.md), the daemon's own clock (Redis TIME), the gRPC listener
// of its [envoy] table. The durations
// until reset are the peer's within a second; the scenario that moves
// the clock is the embedded store's alone.
func TestReplayPeerIntegrationRedis(t *testing.T) {
	dir := peerDir(t)
	srv := redistest.Standalone(t)
	conf := strings.Replace(peerConfig(t, dir), `listen = "127.0.0.1:8081"`, `listen = "127.0.0.1:0"`, 1)
	conf = strings.ReplaceAll(conf, `algorithm = "fixed_window"`, "algorithm = \"fixed_window\"\nmode = \"strict\"")
	// A generous Redis timeout: a check that timed out would be decided
	// by its rule's fail mode on local state (degraded), not by Redis.
	conf += fmt.Sprintf("\n[store]\nredis = [%q]\ntimeout = \"2s\"\n", srv.Addr)
	// Start clear of a minute's end: each scenario's counters live in one
	// window, as the peer's test assumes of its minute and hour limits.
	if s := time.Now().Second(); s > 45 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	d, err := daemontest.Start(conf)
	require.NoError(t, err)
	t.Cleanup(d.Close)
	addrs := d.Daemon.EnvoyAddrs()
	require.Len(t, addrs, 1)
	c := dial(t, addrs[0])
	near := func(t *testing.T, unit, got time.Duration) {
		t.Helper()
		assert.InDelta(t, peerReset(time.Now(), unit).Seconds(), got.Seconds(), 1, "duration until reset of a %s window", unit)
	}
	replay(t, c, near, nil)
}
