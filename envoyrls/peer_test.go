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

	"github.com/rld/rld/envoyrls"
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
	ctx := context.Background()
	check := func(domain string, descs [][]envoyrls.Entry) envoyrls.Response {
		t.Helper()
		r, err := c.Check(ctx, domain, descs, 1)
		require.NoError(t, err)
		return r
	}
	st := func(code string, limit uint32, unit string, remaining uint32, reset time.Duration) envoyrls.Status {
		return envoyrls.Status{Code: code, Limit: limit, Unit: unit, Remaining: remaining, Reset: reset}
	}
	// 10.5 s into the minute, hour and day: the peer's duration until
	// reset is the unit less the whole seconds elapsed.
	const toMinute, toHour, toDay = 50 * time.Second, time.Hour - 10*time.Second, 24*time.Hour - 10*time.Hour - 10*time.Second
	for n, suffix := range []string{"", "_local"} {
		t.Run("keys"+suffix, func(t *testing.T) {
			r := check("foo", one("hello"+suffix, "world"))
			assert.Equal(t, envoyrls.Response{Code: "OK", Statuses: []envoyrls.Status{{Code: "OK"}}, Headers: map[string]string{}}, r)

			r = check("basic", one("key1"+suffix, "foo"))
			assert.Equal(t, "OK", r.Code)
			assert.Equal(t, st("OK", 50, "SECOND", 49, time.Second), r.Statuses[0])

			rnd := fmt.Sprint(1000 + n)
			for i := range 25 {
				r = check("another", one("key2"+suffix, rnd))
				want := st("OK", 20, "MINUTE", uint32(20-(i+1)), toMinute)
				if i >= 20 {
					want = st("OVER_LIMIT", 20, "MINUTE", 0, toMinute)
				}
				assert.Equal(t, want.Code, r.Code, "key2 #%d", i)
				assert.Equal(t, want, r.Statuses[0], "key2 #%d", i)
			}

			rnd = fmt.Sprint(2000 + n)
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
				assert.Equal(t, st("OK", 20, "MINUTE", uint32(20-(i+1)), toMinute), r.Statuses[0], "key2 #%d", i)
				assert.Equal(t, st(code, 10, "HOUR", rem2, toHour), r.Statuses[1], "key3 #%d", i)
			}

			r1 := check("another", one("key4"+suffix, "durTest"))
			clk.add(2 * time.Second)
			r2 := check("another", one("key4"+suffix, "durTest"))
			assert.Equal(t, st("OK", 20, "DAY", 19, toDay), r1.Statuses[0])
			assert.Less(t, r2.Statuses[0].Reset, r1.Statuses[0].Reset)
			clk.add(-2 * time.Second)
		})
	}

	t.Run("share_threshold", func(t *testing.T) {
		const domain = "share-threshold-test"
		for i := range 10 {
			r := check(domain, one("files", fmt.Sprintf("files/%d.pdf", i%2)))
			assert.Equal(t, st("OK", 10, "HOUR", uint32(9-i), toHour), r.Statuses[0], "files #%d", i)
		}
		r := check(domain, one("files", "files/b.csv"))
		assert.Equal(t, "OVER_LIMIT", r.Code)
		assert.Equal(t, st("OVER_LIMIT", 10, "HOUR", 0, toHour), r.Statuses[0])
		for i := range 10 {
			r := check(domain, one("files_no_share", fmt.Sprintf("files_no_share/%d", i)))
			assert.Equal(t, st("OK", 10, "HOUR", 9, toHour), r.Statuses[0], "files_no_share #%d", i)
		}
	})

	t.Run("reload.yaml refused", func(t *testing.T) {
		path := filepath.Join(dir, "test/integration/runtime/current/ratelimit/reload.yaml")
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		_, err = envoyrls.Import([]envoyrls.File{{Name: "reload.yaml", Data: data}})
		assert.ErrorContains(t, err, "reload.yaml: line 8: domain \"reload\": requests_per_unit 0")
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
