package header

import (
	"testing"
	"time"
)

func TestAppendFields(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	check := func(a Answer, want map[string]string) {
		t.Helper()
		fields, _ := AppendFields(nil, nil, a, now)
		got := map[string]string{}
		for _, f := range fields {
			got[f.Name] = string(f.Value)
		}
		if len(got) != len(want) {
			t.Errorf("%+v: got %v, want %v", a, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%+v: %s = %q, want %q", a, k, got[k], v)
			}
		}
	}
	check(Answer{Rule: "search", Limit: 30, Quota: 30, Remaining: 12, Window: time.Minute, Reset: 40500 * time.Millisecond, Next: 500 * time.Millisecond},
		map[string]string{
			XLimit: "30", XRemaining: "12", XReset: "1700000041",
			Policy: `"search";q=30;w=60`, RateLimit: `"search";r=12;t=1`,
		})
	// Limited: Retry-After rounds up and is at least 1; t is the time
	// until quota comes back, not until the bucket is full; the burst
	// is not the quota per window.
	check(Answer{Rule: "login", Limit: 5, Quota: 3, Window: time.Minute, Reset: time.Minute, Retry: 20 * time.Second, Next: 20 * time.Second},
		map[string]string{
			XLimit: "5", XRemaining: "0", XReset: "1700000060",
			Policy: `"login";q=3;w=60`, RateLimit: `"login";r=0;t=20`, RetryAfter: "20",
		})
	// No window known: w is left out; no effective window known: t is.
	check(Answer{Rule: `a"b`, Limit: 1, Quota: 1, Next: -1},
		map[string]string{XLimit: "1", XRemaining: "0", XReset: "1700000000",
			Policy: `"a\"b";q=1`, RateLimit: `"a\"b";r=0`})
	// No quota known (the wire does not carry it): no RateLimit-Policy.
	check(Answer{Rule: "x", Limit: 4, Remaining: 4, Next: -1},
		map[string]string{XLimit: "4", XRemaining: "4", XReset: "1700000000", RateLimit: `"x";r=4`})
	// No limit applied: nothing.
	check(Answer{}, map[string]string{})
	check(Answer{Rule: "allow"}, map[string]string{})
}

func TestSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {time.Minute, 60}} {
		if got := Seconds(c.d); got != c.want {
			t.Errorf("Seconds(%v) = %d, want %d", c.d, got, c.want)
		}
	}
}

func BenchmarkAppendFields(b *testing.B) {
	a := Answer{Rule: "search", Limit: 30, Remaining: 12, Window: time.Minute, Reset: 40 * time.Second}
	now := time.Now()
	var fields []Field
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		fields, buf = AppendFields(fields[:0], buf[:0], a, now)
	}
}
