// Package header renders rate-limit answers as HTTP header fields: the
// de-facto X-RateLimit-* fields, Retry-After, and the IETF RateLimit-Policy
// and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11. An
// Answer travels in a wire response (package header/wireheader), so a
// client of the socket renders the fields the daemon's HTTP endpoint
// renders for the same decision.
package header

import (
	"cmp"
	"strconv"
	"time"
)

// Answer holds the numbers a rate-limit answer carries.
type Answer struct {
	Rule  string // the rule that decided; "" when none applied
	Limit uint64 // the limit's capacity (its burst, when it has one)
	Quota uint64 // the sustained units per QuotaWindow; 0 when unknown
	// QuotaWindow is the window of Quota (RateLimit-Policy's w); 0 means
	// Window.
	QuotaWindow time.Duration
	Remaining   uint64        // units left after this answer
	Window      time.Duration // the limit's period; 0 when unknown
	Reset       time.Duration // time until the limit is fully replenished
	Retry       time.Duration // time until a retry can succeed; 0 when allowed
	// Next is the effective window (RateLimit's t): the time within
	// which no more than Remaining units can be used, which is when a
	// denied client finds quota again (algo.Next); negative when unknown.
	Next time.Duration
}

// Millis converts d to whole milliseconds, rounding up, clamped to the
// wire's 4-byte range; 0 for d ≤ 0.
func Millis(d time.Duration) uint32 {
	if d <= 0 {
		return 0
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms > 1<<32-1 {
		return 1<<32 - 1
	}
	return uint32(ms)
}

// Field is one header field.
type Field struct {
	Name  string
	Value []byte
}

// Field names.
const (
	XLimit     = "X-RateLimit-Limit"
	XRemaining = "X-RateLimit-Remaining"
	XReset     = "X-RateLimit-Reset"
	Policy     = "RateLimit-Policy"
	RateLimit  = "RateLimit"
	RetryAfter = "Retry-After"
)

// Seconds rounds d up to whole seconds: a client told to wait must never
// come back too early.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// AppendFields appends the fields for a at time now to dst, reusing buf for
// the values, and returns both. It renders nothing when no limit applied
// (no rule, or the allow and deny lists, which carry no limit).
// Retry-After is added when a.Retry > 0 (at least 1 second).
//
// RateLimit-Policy advertises the sustained quota, q = a.Quota units per
// w = a.Window (in seconds, rounded up, so that a client pacing itself at
// q per w never goes faster than the limit; w is a.QuotaWindow, or
// a.Window when that is 0); it is left out when a.Quota is 0. The draft defines no parameter for a burst, so the capacity is
// only in X-RateLimit-Limit. RateLimit's t is a.Next rounded up, left out
// when a.Next is negative; with Retry-After it is never later (a.Next ≤
// a.Retry, which algo.Next ensures).
func AppendFields(dst []Field, buf []byte, a Answer, now time.Time) ([]Field, []byte) {
	if a.Rule == "" || a.Limit == 0 {
		return dst, buf
	}
	// buf may grow while appending; record offsets first and slice at the end.
	type span struct {
		name       string
		start, end int
	}
	var spans [6]span
	n := 0
	mark := func(name string, start int) {
		spans[n] = span{name, start, len(buf)}
		n++
	}
	s := len(buf)
	buf = strconv.AppendUint(buf, a.Limit, 10)
	mark(XLimit, s)
	s = len(buf)
	buf = strconv.AppendUint(buf, a.Remaining, 10)
	mark(XRemaining, s)
	s = len(buf)
	buf = strconv.AppendInt(buf, now.Add(a.Reset).Add(time.Second-1).Unix(), 10)
	mark(XReset, s)
	if a.Quota > 0 {
		s = len(buf)
		buf = appendItem(buf, a.Rule)
		buf = append(buf, ";q="...)
		buf = strconv.AppendUint(buf, a.Quota, 10)
		if w := cmp.Or(a.QuotaWindow, a.Window); w > 0 {
			buf = append(buf, ";w="...)
			buf = strconv.AppendInt(buf, Seconds(w), 10)
		}
		mark(Policy, s)
	}
	s = len(buf)
	buf = appendItem(buf, a.Rule)
	buf = append(buf, ";r="...)
	buf = strconv.AppendUint(buf, a.Remaining, 10)
	if a.Next >= 0 {
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, Seconds(a.Next), 10)
	}
	mark(RateLimit, s)
	if a.Retry > 0 {
		s = len(buf)
		buf = strconv.AppendInt(buf, max(1, Seconds(a.Retry)), 10)
		mark(RetryAfter, s)
	}
	for _, sp := range spans[:n] {
		dst = append(dst, Field{Name: sp.name, Value: buf[sp.start:sp.end:sp.end]})
	}
	return dst, buf
}

// appendItem appends name as a structured-field string (RFC 8941 sf-string).
func appendItem(buf []byte, name string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '"' || c == '\\' {
			buf = append(buf, '\\')
		}
		if c < 0x20 || c > 0x7e {
			c = '?'
		}
		buf = append(buf, c)
	}
	return append(buf, '"')
}
