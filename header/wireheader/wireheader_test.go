package wireheader_test

import (
	"testing"
	"time"

	"github.com/rld/rld/header"
	"github.com/rld/rld/header/wireheader"
	"github.com/rld/rld/wire"
)

// TestResponseRoundTrip checks that an answer sent in a response frame
// renders, on the client's side, the fields the daemon renders: every
// time is rounded up to the millisecond in the frame, then to the second
// in the fields, which is the same as rounding up to the second at once.
func TestResponseRoundTrip(t *testing.T) {
	now := time.Unix(1_700_000_000, 250_000_000) // whole milliseconds, as a frame's times
	answers := []header.Answer{
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
		wireheader.SetResponse(&r, &a)
		var back wire.Response
		if err := wire.DecodeResponse(wire.AppendResponse(nil, &r), &back); err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
		b := wireheader.FromResponse(&back)
		want, _ := header.AppendFields(nil, nil, a, now)
		got, _ := header.AppendFields(nil, nil, b, now)
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
	wireheader.SetResponse(&r, &header.Answer{Next: 100 * 24 * time.Hour})
	if r.NextMs != wire.NextUnknown-1 {
		t.Errorf("a 100-day next is sent as %d", r.NextMs)
	}
}
