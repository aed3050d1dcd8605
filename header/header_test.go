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
	check(Answer{Rule: "search", Limit: 30, Remaining: 12, Window: time.Minute, Reset: 40500 * time.Millisecond},
		map[string]string{
			XLimit: "30", XRemaining: "12", XReset: "1700000041",
			Policy: `"search";q=30;w=60`, RateLimit: `"search";r=12;t=41`,
		})
	// Limited: Retry-After rounds up and is at least 1.
	check(Answer{Rule: "login", Limit: 5, Window: time.Minute, Reset: time.Minute, Retry: 10 * time.Millisecond},
		map[string]string{
			XLimit: "5", XRemaining: "0", XReset: "1700000060",
			Policy: `"login";q=5;w=60`, RateLimit: `"login";r=0;t=60`, RetryAfter: "1",
		})
	// No window known: w is left out.
	check(Answer{Rule: `a"b`, Limit: 1},
		map[string]string{XLimit: "1", XRemaining: "0", XReset: "1700000000",
			Policy: `"a\"b";q=1`, RateLimit: `"a\"b";r=0;t=0`})
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
