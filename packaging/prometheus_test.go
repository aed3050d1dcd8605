package packaging

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rld/rld/client"
	"github.com/rld/rld/daemon/daemontest"
	"github.com/rld/rld/redistest"
)

// dashboard is the part of contrib/grafana/rld.json the test reads.
type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// promResult is a Prometheus API answer.
type promResult struct {
	Status string          `json:"status"`
	Error  string          `json:"error"`
	Data   json.RawMessage `json:"data"`
}

// prometheus is a real Prometheus on loopback, scraping one target.
type prometheus struct {
	addr string
}

// startPrometheus runs Debian's prometheus in a temporary directory,
// scraping target (host:port, job "rld") every 200 ms and evaluating
// rules at the same pace, and waits until it is ready.
func startPrometheus(t *testing.T, target, rules string) *prometheus {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(cfg, []byte(fmt.Sprintf(`global:
  scrape_interval: 200ms
  scrape_timeout: 150ms
  evaluation_interval: 200ms
rule_files: [%q]
scrape_configs:
  - job_name: rld
    static_configs:
      - targets: [%q]
`, rules, target)), 0o644))
	p := &prometheus{addr: freeAddr(t)}
	cmd := exec.Command("prometheus", "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+p.addr, "--log.level=warn")
	logs, exited := startLogged(t, cmd)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + p.addr + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("prometheus exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30 s\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond) // polling readiness
	}
}

// get calls the Prometheus API and returns its data.
func (p *prometheus) get(t *testing.T, path string, args url.Values) json.RawMessage {
	t.Helper()
	resp, err := http.Get("http://" + p.addr + path + "?" + args.Encode())
	require.NoError(t, err)
	defer resp.Body.Close()
	var r promResult
	body, _ := io.ReadAll(resp.Body)
	require.NoError(t, json.Unmarshal(body, &r), "%s", body)
	require.Equal(t, "success", r.Status, "%s %v: %s", path, args, r.Error)
	return r.Data
}

// query runs an instant PromQL query and returns the samples' values.
func (p *prometheus) query(t *testing.T, q string) []float64 {
	t.Helper()
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	require.NoError(t, json.Unmarshal(p.get(t, "/api/v1/query", url.Values{"query": {q}}), &data))
	var vals []float64
	for _, r := range data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		require.NoError(t, err, "value of %s", q)
		vals = append(vals, v)
	}
	return vals
}

// poll runs q until it returns a series for which ok holds, or fails the
// test after the deadline.
func (p *prometheus) poll(t *testing.T, q string, deadline time.Time, ok func([]float64) bool) []float64 {
	t.Helper()
	for {
		vals := p.query(t, q)
		if len(vals) > 0 && ok(vals) {
			return vals
		}
		if time.Now().After(deadline) {
			t.Fatalf("query %s: no series (or not as wanted) by the deadline; last: %v", q, vals)
		}
		time.Sleep(100 * time.Millisecond) // polling Prometheus
	}
}

// TestPrometheus: a real Prometheus scrapes a running rld (on Redis, under
// load); rld's /metrics passes promtool check metrics and the alert rules
// promtool check rules and their unit tests; histogram_quantile over rld's latency buckets is a
// number; the alert rules load and evaluate; every query of the Grafana
// dashboard returns a series.
func TestPrometheus(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"prometheus", "promtool"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (package prometheus; make deps installs it): %v", tool, err)
		}
	}
	rules, err := filepath.Abs(filepath.Join(top, "contrib", "prometheus", "rld-alerts.yml"))
	require.NoError(t, err)
	out, err := exec.Command("promtool", "check", "rules", rules).CombinedOutput()
	require.NoError(t, err, "promtool check rules:\n%s", out)
	assert.Contains(t, string(out), "SUCCESS: 6 rules found")
	// The alerts' unit tests: a lone degraded answer does not fire
	// RldDegradedAnswers, a sustained share does, and it clears.
	test := exec.Command("promtool", "test", "rules", "rld-alerts.test.yml")
	test.Dir = filepath.Dir(rules)
	out, err = test.CombinedOutput()
	require.NoError(t, err, "promtool test rules:\n%s", out)

	redis := redistest.Standalone(t)
	s, err := daemontest.Start(fmt.Sprintf(`[store]
redis = [%q]

[[rule]]
name = "search"
match = { endpoint = "/v1/search" }
by = ["api_key"]
limit = 100000
period = "1m"

[[rule]]
name = "login"
match = { endpoint = "/v1/login" }
by = ["ip"]
algorithm = "sliding_log"
limit = 5
period = "1m"

# A share enforced: rld_rollout_limited_total is served, as documented.
[[rule]]
name = "beta"
match = { endpoint = "/v1/beta" }
by = ["api_key"]
limit = 10
period = "1m"
enforce = "50%%"
`, redis.Addr))
	require.NoError(t, err)
	t.Cleanup(s.Close)

	// Load until the end of the test: cached checks (leases, local
	// decisions) and strict ones, some limited.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() })
	c := client.New(s.Socket)
	t.Cleanup(func() { c.Close() })
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_, _ = c.Check(cctx, []client.Descriptor{{Name: "api_key", Value: "k" + strconv.Itoa(i%4)}, {Name: "endpoint", Value: "/v1/search"}}, 1)
			_, _ = c.Check(cctx, []client.Descriptor{{Name: "ip", Value: "203.0.113.7"}, {Name: "endpoint", Value: "/v1/login"}}, 1)
			cancel()
			time.Sleep(time.Millisecond) // pacing the load, not synchronising
		}
	})
	require.NoError(t, s.Daemon.Reload(), "a reload, for the reload panel")

	// What Prometheus will scrape passes promtool's lint.
	resp, err := http.Get("http://" + s.HTTP + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	lint := exec.Command("promtool", "check", "metrics")
	lint.Stdin = strings.NewReader(string(metrics))
	out, err = lint.CombinedOutput()
	require.NoError(t, err, "promtool check metrics:\n%s", out)

	checkDocumentedMetrics(t, string(metrics))

	p := startPrometheus(t, s.HTTP, rules)
	deadline := time.Now().Add(45 * time.Second)
	p.poll(t, `up{job="rld"}`, deadline, func(v []float64) bool { return v[0] == 1 })

	q99 := `histogram_quantile(0.99, sum by (le) (rate(rld_check_duration_seconds_bucket[5s])))`
	v := p.poll(t, q99, deadline, func(v []float64) bool { return !math.IsNaN(v[0]) })
	assert.Greater(t, v[0], 0.0)
	t.Logf("p99 check latency: %.6f s", v[0])

	// The alert rules are loaded and evaluate without error.
	want := []string{"RldDown", "RldRedisBreakerOpen", "RldDegradedAnswers", "RldConfigReloadFailed", "RldCheckLatencyHigh"}
	for {
		var data struct {
			Groups []struct {
				Rules []struct {
					Name           string `json:"name"`
					Health         string `json:"health"`
					LastError      string `json:"lastError"`
					LastEvaluation string `json:"lastEvaluation"`
				} `json:"rules"`
			} `json:"groups"`
		}
		require.NoError(t, json.Unmarshal(p.get(t, "/api/v1/rules", url.Values{"type": {"alert"}}), &data))
		health := map[string]string{}
		for _, g := range data.Groups {
			for _, r := range g.Rules {
				health[r.Name] = r.Health
				assert.Empty(t, r.LastError, r.Name)
			}
		}
		done := true
		for _, name := range want {
			if health[name] != "ok" {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alert rules not all loaded and evaluated: %v", health)
		}
		time.Sleep(100 * time.Millisecond) // polling Prometheus
	}

	// Every dashboard query returns a series against the scraped rld.
	raw, err := os.ReadFile(filepath.Join(top, "contrib", "grafana", "rld.json"))
	require.NoError(t, err)
	var d dashboard
	require.NoError(t, json.Unmarshal(raw, &d))
	require.NotEmpty(t, d.Panels)
	var exprs []string
	for _, panel := range d.Panels {
		require.NotEmpty(t, panel.Targets, panel.Title)
		for _, target := range panel.Targets {
			// Grafana's variables: all instances, a window a few scrapes long.
			q := strings.NewReplacer(`$instance`, `.*`, `$__rate_interval`, `5s`).Replace(target.Expr)
			vals := p.poll(t, q, deadline, func([]float64) bool { return true })
			t.Logf("%s: %s = %v", panel.Title, target.Expr, vals)
			exprs = append(exprs, target.Expr)
		}
	}
	all := strings.Join(exprs, "\n")
	for _, m := range []string{"rld_checks_total", "rld_check_duration_seconds_bucket", "rld_redis_calls_total",
		"rld_redis_breaker_state", "rld_cache_decisions_total", "rld_cache_lease_units_total",
		`decision=~"allowed_degraded|limited_degraded"`, "rld_config_reloads_total", "rld_build_info"} {
		assert.Contains(t, all, m, "the dashboard shows %s", m)
	}
}

// checkDocumentedMetrics: every metric in docs/operations.md's table is
// served with the type the table gives, and every rld_ family served is in
// the table.
func checkDocumentedMetrics(t *testing.T, exposition string) {
	t.Helper()
	served := map[string]string{}
	for _, line := range strings.Split(exposition, "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if parts := strings.Fields(f); len(parts) == 2 {
				served[parts[0]] = parts[1]
			}
		}
	}
	doc, err := os.ReadFile(filepath.Join(top, "docs", "operations.md"))
	require.NoError(t, err)
	documented := map[string]bool{}
	row := regexp.MustCompile("^\\| (`rld_[^|]+) \\| (counter|gauge|histogram) \\|")
	name := regexp.MustCompile("`(rld_[a-z_]+)")
	for _, line := range strings.Split(string(doc), "\n") {
		m := row.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		for _, n := range name.FindAllStringSubmatch(m[1], -1) {
			documented[n[1]] = true
			assert.Equal(t, m[2], served[n[1]], "docs/operations.md: %s is a %s", n[1], m[2])
		}
	}
	require.NotEmpty(t, documented, "docs/operations.md has a metrics table")
	for n := range served {
		if strings.HasPrefix(n, "rld_") {
			assert.True(t, documented[n], "%s is served but not in docs/operations.md's metrics table", n)
		}
	}
}
