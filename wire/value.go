package wire

import (
	"crypto/sha256"
	"encoding/hex"
)

// The rule for long values, which clients and the daemon apply alike: a
// descriptor or attribute value longer than its limit is sent, and
// derived, as DigestPrefix and the 64 lower-case hex digits of the
// SHA-256 of the whole value. So a request's content never breaks a
// protocol limit, and distinct long values keep distinct buckets.
const (
	// DigestPrefix starts the digest that replaces a long value.
	DigestPrefix = "sha256:"
	// DigestLen is the length of a digest: the prefix and 64 hex digits.
	DigestLen = len(DigestPrefix) + 2*sha256.Size

	// MaxTargetLen is the limit of the :target attribute.
	MaxTargetLen = MaxAttrValueLen
	// MaxHeaderLen is the limit of a :h: attribute.
	MaxHeaderLen = 4096
	// MaxHeaders is the most :h: attributes a client sends: with every
	// value at its limit, the frame still fits in MaxFrame.
	MaxHeaders = 8
)

// AppendValue appends v to dst by the rule for long values: v itself
// when it is at most limit bytes, else its digest.
func AppendValue(dst, v []byte, limit int) []byte {
	if len(v) <= limit {
		return append(dst, v...)
	}
	sum := sha256.Sum256(v)
	dst = append(dst, DigestPrefix...)
	return hex.AppendEncode(dst, sum[:])
}

// IsDigest reports whether v is a digest that replaced a long value.
func IsDigest(v []byte) bool {
	return len(v) == DigestLen && string(v[:len(DigestPrefix)]) == DigestPrefix
}
