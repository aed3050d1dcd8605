package header

import (
	"testing"
	"time"

	"github.com/rld/rld/wire"
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

// TestResponseRoundTrip checks that an answer sent in a response frame
// renders, on the client's side, the fields the daemon renders: every
// time is rounded up to the millisecond in the frame, then to the second
// in the fields, which is the same as rounding up to the second at once.
func TestResponseRoundTrip(t *testing.T) {
	now := time.Unix(1_700_000_000, 250_000_000) // whole milliseconds, as a frame's times
	answers := []Answer{
		{Rule: "search", Limit: 30, Quota: 30, QuotaWindow: time.Minute, Remaining: 12, Window: time.Minute,
			Reset: 40500*time.Millisecond + 1, Next: 500*time.Millisecond + 1},
		// A burst: the quota is not the capacity.
		{Rule: "login", Limit: 5, Quota: 3, QuotaWindow: time.Minute, Window: time.Minute, Reset: time.Minute,
			Retry: 20*time.Second - 1, Next: 20*time.Second - 1},
		// Next unknown, quota window twice the window (sliding counter of 1).
		{Rule: "s", Limit: 1, Quota: 1, QuotaWindow: 2 * time.Second, Remaining: 1, Window: time.Second,
			Reset: time.Second, Next: -1},
		// Next 0, and sub-millisecond times.
		{Rule: "t", Limit: 4, Quota: 4, QuotaWindow: time.Second, Remaining: 3, Window: time.Second,
			Reset: time.Microsecond, Next: 0},
		// Exactly on a second, and one nanosecond past it.
		{Rule: "u", Limit: 9, Quota: 9, QuotaWindow: time.Hour, Window: time.Hour, Reset: 2 * time.Second,
			Retry: time.Second + 1, Next: time.Second},
		// No limit applied.
		{Next: -1},
	}
	for _, a := range answers {
		var r wire.Response
		SetResponse(&r, &a)
		var back wire.Response
		if err := wire.DecodeResponse(wire.AppendResponse(nil, &r), &back); err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
		b := FromResponse(&back)
		want, _ := AppendFields(nil, nil, a, now)
		got, _ := AppendFields(nil, nil, b, now)
		if len(got) != len(want) {
			t.Fatalf("%+v: from the frame %q, want %q", a, got, want)
		}
		for i := range want {
			if got[i].Name != want[i].Name || string(got[i].Value) != string(want[i].Value) {
				t.Errorf("%+v: from the frame %s: %s, want %s: %s", a, got[i].Name, got[i].Value, want[i].Name, want[i].Value)
			}
		}
		if (a.Next < 0) != (back.NextMs == wire.NextUnknown) {
			t.Errorf("%+v: next sent as %d", a, back.NextMs)
		}
	}
	// A next too long for the frame is clamped below NextUnknown, never
	// sent as unknown.
	var r wire.Response
	SetResponse(&r, &Answer{Next: 100 * 24 * time.Hour})
	if r.NextMs != wire.NextUnknown-1 {
		t.Errorf("a 100-day next is sent as %d", r.NextMs)
	}
}
