// Package header renders rate-limit answers as HTTP header fields: the
// de-facto X-RateLimit-* fields, Retry-After, and the IETF RateLimit-Policy
// and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11.
package header

import (
	"strconv"
	"time"
)

// Answer holds the numbers a rate-limit answer carries.
type Answer struct {
	Rule      string        // the rule that decided; "" when none applied
	Limit     uint64        // the limit's capacity
	Remaining uint64        // units left after this answer
	Window    time.Duration // the limit's period; 0 when unknown
	Reset     time.Duration // time until the limit is fully replenished
	Retry     time.Duration // time until a retry can succeed; 0 when allowed
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
	s = len(buf)
	buf = appendItem(buf, a.Rule)
	buf = append(buf, ";q="...)
	buf = strconv.AppendUint(buf, a.Limit, 10)
	if a.Window > 0 {
		buf = append(buf, ";w="...)
		buf = strconv.AppendInt(buf, Seconds(a.Window), 10)
	}
	mark(Policy, s)
	s = len(buf)
	buf = appendItem(buf, a.Rule)
	buf = append(buf, ";r="...)
	buf = strconv.AppendUint(buf, a.Remaining, 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, Seconds(a.Reset), 10)
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
