// Package wireheader carries a rate-limit answer (header.Answer) in a
// response frame of the binary protocol (package wire) and reads it back,
// so that a client of the socket renders the header fields that the
// daemon's HTTP endpoint renders for the same decision. It joins header
// and wire, which know nothing of each other.
package wireheader

import (
	"time"

	"github.com/rld/rld/header"
	"github.com/rld/rld/wire"
)

// SetResponse sets the fields of r that carry an answer (rule, limit,
// remaining, reset, retry after, window, quota, quota window and next) to
// those of a, reusing r.Rule's buffer; durations are rounded up to whole
// milliseconds (and clamped to the wire's range), so that a client that
// waits them is never early. A negative a.Next is sent as
// wire.NextUnknown. It leaves r's other fields alone.
func SetResponse(r *wire.Response, a *header.Answer) {
	r.Rule = append(r.Rule[:0], a.Rule...)
	r.Limit = a.Limit
	r.Remaining = a.Remaining
	r.ResetMs = header.Millis(a.Reset)
	r.RetryMs = header.Millis(a.Retry)
	r.WindowMs = header.Millis(a.Window)
	r.Quota = a.Quota
	r.QuotaWindowMs = header.Millis(a.QuotaWindow)
	r.NextMs = wire.NextUnknown
	if a.Next >= 0 {
		r.NextMs = min(header.Millis(a.Next), wire.NextUnknown-1)
	}
}

// FromResponse returns the answer that the response r carries: the one
// the daemon rendered for its HTTP endpoint, to the millisecond. Since
// every time is rounded up to whole seconds when rendered, and the frame
// rounds up to whole milliseconds, header.AppendFields renders the same fields
// from either (X-RateLimit-Reset, a point in time, is as exact as the
// moment each side renders it).
func FromResponse(r *wire.Response) header.Answer {
	ms := func(v uint32) time.Duration { return time.Duration(v) * time.Millisecond }
	a := header.Answer{
		Rule:        string(r.Rule),
		Limit:       r.Limit,
		Quota:       r.Quota,
		QuotaWindow: ms(r.QuotaWindowMs),
		Remaining:   r.Remaining,
		Window:      ms(r.WindowMs),
		Reset:       ms(r.ResetMs),
		Retry:       ms(r.RetryMs),
		Next:        -1,
	}
	if r.NextMs != wire.NextUnknown {
		a.Next = ms(r.NextMs)
	}
	return a
}
