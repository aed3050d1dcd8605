package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/rld/rld/wire"
)

// fakeMeasurement returns a measurement of n answers with latencies
// base, 2·base, … n·base; one in ten limited, one error.
func fakeMeasurement(n int, base time.Duration) *measurement {
	m := &measurement{hist: newHist(), lag: newHist(), byCode: map[wire.Code]int64{}}
	for i := 1; i <= n; i++ {
		record(m.hist, int64(i)*int64(base))
		record(m.lag, 1000)
	}
	m.arrived, m.answered, m.sent = int64(n), int64(n), int64(n)
	m.byStatus[wire.StatusLimited] = int64(n / 10)
	m.byStatus[wire.StatusError] = 1
	m.byStatus[wire.StatusAllowed] = int64(n) - m.byStatus[wire.StatusLimited] - 1
	m.byCode[wire.CodeOverloaded] = 1
	m.firstErr = "overloaded: too many"
	return m
}

func testReport(t *testing.T) *Report {
	t.Helper()
	l := &load{mode: modeOpen, rate: 1000, conns: 2, depth: 4, duration: 2 * time.Second, warmup: time.Second}
	ks, _ := newKeySpace(distUniform, 10, 0)
	l.keys = ks
	tbl := Table{Store: storeEmbedded}
	for _, tc := range []struct {
		name string
		base time.Duration
	}{{"echo", 10 * time.Microsecond}, {"rld", 20 * time.Microsecond}} {
		r, err := newResult(tc.name, fakeMeasurement(1000, tc.base), l)
		if err != nil {
			t.Fatal(err)
		}
		tbl.Results = append(tbl.Results, r)
	}
	tbl.setRatios()
	return &Report{Mode: l.mode, Rate: l.rate, Connections: l.conns, Depth: l.depth, DurationS: 2, WarmupS: 1,
		Keys: ks.String(), Descriptors: "api_key=k{n}", Cost: 1, Tables: []Table{tbl}}
}

func TestJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := writeJSON(&buf, testReport(t)); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Mode   string
		Rate   float64
		Tables []struct {
			Store   string
			Results []struct {
				Target       string
				AchievedRate float64 `json:"achieved_rate"`
				Requests     int64
				Allowed      int64
				Limited      int64
				Errors       int64
				ErrorCodes   map[string]int64   `json:"error_codes"`
				Latency      map[string]float64 `json:"latency_us"`
				SendLag      map[string]float64 `json:"send_lag_us"`
				Ratio        map[string]float64 `json:"ratio_to_first"`
				Histogram    string
			}
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	if got.Mode != "open" || got.Rate != 1000 || len(got.Tables) != 1 || got.Tables[0].Store != "embedded" {
		t.Fatalf("header: %+v", got)
	}
	rs := got.Tables[0].Results
	if len(rs) != 2 || rs[0].Target != "echo" || rs[1].Target != "rld" {
		t.Fatalf("results: %+v", rs)
	}
	echo, rld := rs[0], rs[1]
	if echo.AchievedRate != 500 || echo.Requests != 1000 || echo.Allowed != 899 || echo.Limited != 100 ||
		echo.Errors != 1 || echo.ErrorCodes["overloaded"] != 1 {
		t.Errorf("echo counts: %+v", echo)
	}
	// Latencies 10 µs … 10 ms: p50 about 5 ms, p99 about 9.9 ms (3 digits).
	for k, want := range map[string]float64{"min": 10, "p50": 5000, "p99": 9900, "max": 10000} {
		if got := echo.Latency[k]; got < want*0.99 || got > want*1.01 {
			t.Errorf("echo latency %s = %v µs, want about %v", k, got, want)
		}
	}
	for _, k := range []string{"min", "p50", "p90", "p99", "p99.9", "p99.99", "max", "mean"} {
		if _, ok := rld.Latency[k]; !ok {
			t.Errorf("latency_us has no %q", k)
		}
		if r := rld.Ratio[k]; r < 1.98 || r > 2.02 {
			t.Errorf("rld ratio_to_first %s = %v, want 2", k, r)
		}
	}
	if echo.Ratio != nil {
		t.Errorf("the first target has ratios: %v", echo.Ratio)
	}
	if echo.SendLag["p99"] != 1 {
		t.Errorf("send lag: %v, want 1 µs", echo.SendLag)
	}
	raw, err := base64.StdEncoding.DecodeString(rld.Histogram)
	if err != nil {
		t.Fatal(err)
	}
	h, err := hdrhistogram.Decode(raw)
	if err != nil {
		t.Fatalf("histogram does not decode: %v", err)
	}
	if h.TotalCount() != 1000 || h.Max() < int64(19*time.Millisecond) {
		t.Errorf("decoded histogram: %d values, max %d", h.TotalCount(), h.Max())
	}
}

func TestTable(t *testing.T) {
	rep := testReport(t)
	var buf bytes.Buffer
	if err := writeTable(&buf, &rep.Tables[0]); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"echo", "rld", "p99.99", "(2.00×)", "achieved/s", "500", "899",
		"first error: overloaded: too many", "send lag p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestFormat(t *testing.T) {
	for us, want := range map[float64]string{0.5: "0.50µs", 8.123: "8.12µs", 12.34: "12.3µs", 123.4: "123µs",
		1234: "1.23ms", 12345: "12.3ms", 2.5e6: "2.50s"} {
		if got := formatMicros(us); got != want {
			t.Errorf("formatMicros(%v) = %q, want %q", us, got, want)
		}
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1234: "-1,234"} {
		if got := group(n); got != want {
			t.Errorf("group(%d) = %q, want %q", n, got, want)
		}
	}
}
