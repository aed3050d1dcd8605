package wire_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/rld/rld/wire"
)

// updateCorpus rewrites the golden corpus from corpusCases.
var updateCorpus = flag.Bool("update", false, "rewrite ../clients/testdata/golden.tsv from the wire package")

// corpusPath is the language-neutral corpus that every client replays;
// clients/testdata/README.md describes its format.
const corpusPath = "../clients/testdata/golden.tsv"

// maxExact is 2^53, the largest 8-byte value the corpus holds: a double
// (LuaJIT's only number type) represents every integer up to it exactly.
const maxExact = 1 << 53

// corpusLine is one case of the corpus, of one of seven kinds.
type corpusLine struct {
	// "encode", "encode_error", "encode_lease", "encode_lease_error",
	// "decode", "decode_acquire", "decode_error"
	kind string
	name string
	req  wire.Request // encode, encode_error
	cost uint64       // encode, encode_error: may exceed uint32 for encode_error
	res  wire.Response
	hex  []byte // decode, decode_error: the frame
	what string // encode_error, decode_error
}

// corpusCases returns every case of the corpus, built with the wire
// package's encoders.
func corpusCases() []corpusLine {
	var lines []corpusLine
	enc := func(name string, op wire.Op, id uint32, cost uint32, ds ...wire.Descriptor) {
		lines = append(lines, corpusLine{kind: "encode", name: name,
			req: wire.Request{Op: op, ID: id, Cost: cost, Descs: ds}, cost: uint64(cost)})
	}
	encErr := func(name, what string, op wire.Op, id uint32, cost uint64, ds ...wire.Descriptor) {
		lines = append(lines, corpusLine{kind: "encode_error", name: name, what: what,
			req: wire.Request{Op: op, ID: id, Descs: ds}, cost: cost})
	}
	dec := func(name string, r wire.Response) {
		lines = append(lines, corpusLine{kind: "decode", name: name, res: r,
			hex: wire.AppendResponse(nil, &r)})
	}
	encLease := func(name string, op wire.Op, id uint32, cost uint32, lease []byte) {
		lines = append(lines, corpusLine{kind: "encode_lease", name: name,
			req: wire.Request{Op: op, ID: id, Cost: cost, Token: lease}, cost: uint64(cost)})
	}
	encLeaseErr := func(name, what string, op wire.Op, id uint32, cost uint32, lease []byte) {
		lines = append(lines, corpusLine{kind: "encode_lease_error", name: name, what: what,
			req: wire.Request{Op: op, ID: id, Cost: cost, Token: lease}, cost: uint64(cost)})
	}
	decAcquire := func(name string, r wire.Response) {
		r.Op = wire.OpAcquire
		lines = append(lines, corpusLine{kind: "decode_acquire", name: name, res: r,
			hex: wire.AppendResponse(nil, &r)})
	}
	decErr := func(name, what string, f []byte) {
		lines = append(lines, corpusLine{kind: "decode_error", name: name, what: what, hex: f})
	}
	d := func(name, value string) wire.Descriptor {
		return wire.Descriptor{Name: []byte(name), Value: []byte(value)}
	}
	many := func(n int) []wire.Descriptor {
		ds := make([]wire.Descriptor, n)
		for i := range ds {
			ds[i] = d(fmt.Sprintf("d%02d", i), fmt.Sprintf("v%d", i))
		}
		return ds
	}

	// Requests.
	enc("ping", wire.OpPing, 1, 0)
	enc("ping-max-id", wire.OpPing, math.MaxUint32, 0)
	enc("worked-example", wire.OpCheck, 7, 1, d("api_key", "sk_123"), d("endpoint", "/v1/search"))
	enc("check-no-descriptors", wire.OpCheck, 2, 1)
	enc("check-one-descriptor", wire.OpCheck, 3, 1, d("ip", "192.0.2.1"))
	enc("peek", wire.OpPeek, 4, 1, d("api_key", "sk_123"))
	enc("peek-cost-5", wire.OpPeek, 5, 5, d("tenant", "acme"), d("tier", "gold"))
	enc("cost-0", wire.OpCheck, 6, 0, d("k", "v"))
	enc("cost-max", wire.OpCheck, 8, math.MaxUint32, d("k", "v"))
	enc("id-0", wire.OpCheck, 0, 1, d("k", "v"))
	enc("id-max", wire.OpCheck, math.MaxUint32, 1, d("k", "v"))
	enc("id-high-byte", wire.OpCheck, 0x80000001, 1, d("k", "v"))
	enc("32-descriptors", wire.OpCheck, 9, 1, many(wire.MaxDescriptors)...)
	enc("name-64-bytes", wire.OpCheck, 10, 1, d(strings.Repeat("n", wire.MaxNameLen), "v"))
	enc("name-1-byte", wire.OpCheck, 11, 1, d("n", "v"))
	enc("value-1024-bytes", wire.OpCheck, 12, 1, d("k", strings.Repeat("v", wire.MaxValueLen)))
	enc("value-empty", wire.OpCheck, 13, 1, d("ip", ""))
	enc("value-empty-between", wire.OpCheck, 14, 1, d("a", "1"), d("b", ""), d("c", "3"))
	enc("non-ascii", wire.OpCheck, 15, 1, d("nom", "café ☕"), wire.Descriptor{Name: []byte{0xff, 0x00, 0x80}, Value: []byte{0x00, 0xfe, 0x0a, 0x09}})
	enc("duplicate-names", wire.OpCheck, 16, 2, d("ip", "192.0.2.1"), d("ip", "192.0.2.2"))
	enc("max-frame", wire.OpCheck, 17, 1, maxFrameDescs()...)
	enc("sixteen-descriptors-at-limits", wire.OpPeek, 18, 1, bigDescs(16)...)
	enc("attributes", wire.OpCheck, 19, 1, d(":peer", "203.0.113.7"), d(":method", "GET"), d(":host", "api.example.com"),
		d(":target", "/v1/search?q=1"), d(":h:x-api-key", "sk_123"))
	enc("attr-value-16384-bytes", wire.OpCheck, 40, 1, d(":target", strings.Repeat("t", wire.MaxAttrValueLen)))

	enc("acquire", wire.OpAcquire, 30, 1, d("api_key", "sk_123"), d("endpoint", "/v1/export"))
	enc("acquire-estimate-500", wire.OpAcquire, 31, 500, d("api_key", "sk_123"), d("endpoint", "/v1/chat"))
	enc("acquire-no-descriptors", wire.OpAcquire, 32, 0)

	encErr("33-descriptors", "more than 32 descriptors", wire.OpCheck, 20, 1, many(wire.MaxDescriptors+1)...)
	encErr("name-empty", "descriptor name empty", wire.OpCheck, 21, 1, d("", "v"))
	encErr("name-65-bytes", "descriptor name of 65 bytes", wire.OpCheck, 22, 1, d(strings.Repeat("n", wire.MaxNameLen+1), "v"))
	encErr("value-1025-bytes", "descriptor value of 1025 bytes", wire.OpCheck, 23, 1, d("k", strings.Repeat("v", wire.MaxValueLen+1)))
	encErr("cost-2^32", "cost 4294967296 does not fit in 4 bytes", wire.OpCheck, 24, math.MaxUint32+1, d("k", "v"))
	over := maxFrameDescs()
	over[len(over)-1].Value = append(over[len(over)-1].Value, 'x')
	encErr("frame-65537-bytes", "frame of 65537 bytes, above 65536", wire.OpCheck, 25, 1, over...)
	encErr("attr-value-16385-bytes", "attribute value of 16385 bytes", wire.OpCheck, 26, 1, d(":target", strings.Repeat("t", wire.MaxAttrValueLen+1)))
	encErr("peek-33-descriptors", "PEEK with more than 32 descriptors", wire.OpPeek, 27, 1, many(wire.MaxDescriptors+1)...)
	encErr("acquire-33-descriptors", "ACQUIRE with more than 32 descriptors", wire.OpAcquire, 28, 1, many(wire.MaxDescriptors+1)...)

	// RELEASE and SETTLE carry a lease, which clients pass on as they got it.
	lease := []byte("AgHr9ILet56YA1cJF4ip_E7VAuv0gt63npgDAB6Ajs4cAA1zZWFyY2gABXNrX2NjS9pZ0PX_mHKmNPgT37OUyw")
	encLease("release", wire.OpRelease, 40, 0, lease)
	encLease("release-lease-1-byte", wire.OpRelease, 41, 0, []byte("A"))
	encLease("release-lease-1024-bytes", wire.OpRelease, 42, 0, bytes.Repeat([]byte("L"), wire.MaxTokenLen))
	encLease("settle", wire.OpSettle, 43, 1234, lease)
	encLease("settle-cost-0", wire.OpSettle, 44, 0, lease)
	encLease("settle-cost-max", wire.OpSettle, math.MaxUint32, math.MaxUint32, lease)
	encLeaseErr("release-lease-empty", "RELEASE of an empty lease", wire.OpRelease, 45, 0, nil)
	encLeaseErr("release-lease-1025-bytes", "RELEASE of a lease of 1025 bytes", wire.OpRelease, 46, 0, bytes.Repeat([]byte("L"), wire.MaxTokenLen+1))
	encLeaseErr("settle-lease-empty", "SETTLE of an empty lease", wire.OpSettle, 47, 5, nil)

	// Responses.
	const unknown = wire.NextUnknown
	dec("worked-example", wire.Response{Op: wire.OpCheck, ID: 7, Status: wire.StatusLimited,
		Limit: 30, Remaining: 0, ResetMs: 41000, RetryMs: 2000, WindowMs: 60000,
		Quota: 30, QuotaWindowMs: 60000, NextMs: 2000, Rule: []byte("search")})
	dec("pong", wire.Response{Op: wire.OpPing, ID: 1, NextMs: unknown})
	dec("allowed", wire.Response{Op: wire.OpCheck, ID: 100, Status: wire.StatusAllowed,
		Limit: 10, Remaining: 9, ResetMs: 6000, WindowMs: 60000,
		Quota: 10, QuotaWindowMs: 60000, NextMs: 6000, Rule: []byte("per-key")})
	dec("allowed-no-rule", wire.Response{Op: wire.OpCheck, ID: 101, Status: wire.StatusAllowed, NextMs: unknown})
	dec("allowed-peek", wire.Response{Op: wire.OpPeek, ID: 102, Status: wire.StatusAllowed,
		Limit: 5, Remaining: 5, WindowMs: 1000, Quota: 5, QuotaWindowMs: 1000, NextMs: 201, Rule: []byte("p")})
	dec("limited", wire.Response{Op: wire.OpCheck, ID: 103, Status: wire.StatusLimited,
		Limit: 3, Remaining: 0, ResetMs: 2500, RetryMs: 834, WindowMs: 2500,
		Quota: 3, QuotaWindowMs: 2500, NextMs: 834, Rule: []byte("burst")})
	dec("limited-peek", wire.Response{Op: wire.OpPeek, ID: 104, Status: wire.StatusLimited,
		Limit: 1, Remaining: 0, ResetMs: 1, RetryMs: 1, WindowMs: 1, Quota: 1, QuotaWindowMs: 1, NextMs: 1, Rule: []byte("one")})
	dec("quota-below-limit-burst", wire.Response{Op: wire.OpCheck, ID: 114, Status: wire.StatusAllowed,
		Limit: 50, Remaining: 49, ResetMs: 6000, WindowMs: 60000,
		Quota: 10, QuotaWindowMs: 60000, NextMs: 6000, Rule: []byte("burst")})
	dec("quota-below-limit-sliding-counter", wire.Response{Op: wire.OpCheck, ID: 115, Status: wire.StatusAllowed,
		Limit: 100, Remaining: 60, ResetMs: 60000, WindowMs: 60000,
		Quota: 99, QuotaWindowMs: 60000, NextMs: unknown, Rule: []byte("sliding")})
	dec("quota-window-above-window", wire.Response{Op: wire.OpCheck, ID: 116, Status: wire.StatusLimited,
		Limit: 1, Remaining: 0, ResetMs: 2000, RetryMs: 1500, WindowMs: 1000,
		Quota: 1, QuotaWindowMs: 2000, NextMs: 1500, Rule: []byte("sliding-one")})
	dec("next-unknown", wire.Response{Op: wire.OpCheck, ID: 117, Status: wire.StatusAllowed,
		Limit: 5, Remaining: 4, ResetMs: 60000, WindowMs: 60000,
		Quota: 5, QuotaWindowMs: 60000, NextMs: unknown, Rule: []byte("login")})
	dec("next-0", wire.Response{Op: wire.OpCheck, ID: 118, Status: wire.StatusAllowed,
		Limit: 4, Remaining: 3, ResetMs: 1, WindowMs: 1000, Quota: 4, QuotaWindowMs: 1000, NextMs: 0, Rule: []byte("tb")})
	dec("blocked", wire.Response{Op: wire.OpCheck, ID: 105, Status: wire.StatusBlocked, NextMs: unknown, Rule: []byte("deny")})
	dec("allowed-degraded", wire.Response{Op: wire.OpCheck, ID: 106, Flags: wire.FlagDegraded,
		Status: wire.StatusAllowedDegraded, Limit: 100, Remaining: 42, ResetMs: 500, WindowMs: 1000,
		Quota: 100, QuotaWindowMs: 1000, NextMs: unknown, Rule: []byte("fleet")})
	dec("limited-degraded", wire.Response{Op: wire.OpCheck, ID: 107, Flags: wire.FlagDegraded,
		Status: wire.StatusLimited, Limit: 100, Remaining: 0, ResetMs: 1000, RetryMs: 1000, WindowMs: 1000,
		Quota: 100, QuotaWindowMs: 1000, NextMs: 1000, Rule: []byte("fleet-closed")})
	dec("unknown-flag-bits", wire.Response{Op: wire.OpCheck, ID: 108, Flags: 0xfffe,
		Status: wire.StatusAllowed, Limit: 2, Remaining: 1, ResetMs: 10, WindowMs: 20,
		Quota: 2, QuotaWindowMs: 20, NextMs: 10, Rule: []byte("r")})
	dec("all-flag-bits", wire.Response{Op: wire.OpCheck, ID: 109, Flags: 0xffff,
		Status: wire.StatusAllowedDegraded, Limit: 2, Remaining: 1, ResetMs: 10, WindowMs: 20,
		Quota: 2, QuotaWindowMs: 20, NextMs: unknown, Rule: []byte("r")})
	dec("limit-2^53", wire.Response{Op: wire.OpCheck, ID: 110, Status: wire.StatusAllowed,
		Limit: maxExact, Remaining: maxExact - 1, ResetMs: 1, WindowMs: 1,
		Quota: maxExact - 2, QuotaWindowMs: 1, NextMs: 1, Rule: []byte("huge")})
	dec("remaining-2^53", wire.Response{Op: wire.OpPeek, ID: 111, Status: wire.StatusAllowed,
		Limit: maxExact, Remaining: maxExact, WindowMs: 3600000,
		Quota: maxExact, QuotaWindowMs: 3600000, NextMs: unknown, Rule: []byte("huge")})
	dec("u32-fields-max", wire.Response{Op: wire.OpCheck, ID: math.MaxUint32, Status: wire.StatusLimited,
		Limit: 1 << 32, Remaining: 0, ResetMs: math.MaxUint32, RetryMs: math.MaxUint32, WindowMs: math.MaxUint32,
		Quota: 1 << 32, QuotaWindowMs: math.MaxUint32, NextMs: math.MaxUint32 - 1, Rule: []byte("slow")})
	dec("rule-255-bytes", wire.Response{Op: wire.OpCheck, ID: 112, Status: wire.StatusAllowed,
		Limit: 7, Remaining: 6, ResetMs: 100, WindowMs: 700, Quota: 7, QuotaWindowMs: 700, NextMs: 100,
		Rule: bytes.Repeat([]byte("r"), wire.MaxRuleLen)})
	dec("rule-non-ascii", wire.Response{Op: wire.OpCheck, ID: 113, Status: wire.StatusAllowed,
		Limit: 7, Remaining: 6, ResetMs: 100, WindowMs: 700, Quota: 7, QuotaWindowMs: 700, NextMs: 100,
		Rule: []byte("règle \"q\"\\\x00\xff")})
	for c := wire.CodeMalformed; c <= wire.CodeNotFound; c++ {
		op := wire.OpCheck
		switch c {
		case wire.CodeUnknownOp:
			op = 0x09
		case wire.CodeNotSupported:
			op = wire.OpReset
		}
		dec("error-"+c.String(), wire.Response{Op: op, ID: 200 + uint32(c), Status: wire.StatusError,
			NextMs: unknown, Code: c, Message: []byte("detail for " + c.String())})
	}
	dec("released", wire.Response{Op: wire.OpRelease, ID: 40, Status: wire.StatusAllowed,
		Limit: 2, Remaining: 1, ResetMs: 29000, WindowMs: 30000, NextMs: unknown, Rule: []byte("exports")})
	dec("release-unknown", wire.Response{Op: wire.OpRelease, ID: 41, Status: wire.StatusError, NextMs: unknown,
		Code: wire.CodeNotFound, Message: []byte("policy: release: unknown or expired lease")})
	dec("settled", wire.Response{Op: wire.OpSettle, ID: 43, Status: wire.StatusAllowed,
		Limit: 100000, Remaining: 98766, ResetMs: 44456, WindowMs: 3600000, Quota: 100000, QuotaWindowMs: 3600000,
		NextMs: 36, Rule: []byte("tokens")})
	decAcquire("acquired", wire.Response{ID: 30, Status: wire.StatusAllowed,
		Limit: 2, Remaining: 1, ResetMs: 30000, WindowMs: 30000, NextMs: unknown,
		Rule: []byte("exports"), Token: lease})
	decAcquire("acquire-limited", wire.Response{ID: 33, Status: wire.StatusLimited,
		Limit: 2, Remaining: 0, ResetMs: 29000, RetryMs: 12000, WindowMs: 30000,
		NextMs: 12000, Rule: []byte("exports")})
	decAcquire("acquire-degraded", wire.Response{ID: 34, Flags: wire.FlagDegraded, Status: wire.StatusAllowedDegraded,
		Limit: 1, Remaining: 0, ResetMs: 30000, WindowMs: 30000, NextMs: unknown,
		Rule: []byte("exports"), Token: []byte("AgE")})
	decAcquire("acquire-error", wire.Response{ID: 35, Status: wire.StatusError, NextMs: unknown,
		Code: wire.CodeMalformed, Message: []byte("field runs past end of frame")})
	decAcquire("acquire-lease-1024-bytes", wire.Response{ID: 36, Status: wire.StatusAllowed, NextMs: unknown,
		Rule: []byte("r"), Token: bytes.Repeat([]byte("L"), wire.MaxTokenLen)})
	dec("error-no-message", wire.Response{Op: wire.OpCheck, ID: 220, Status: wire.StatusError, NextMs: unknown, Code: wire.CodeInternal})
	dec("error-unknown-code", wire.Response{Op: wire.OpCheck, ID: 221, Status: wire.StatusError, NextMs: unknown, Code: 999, Message: []byte("a later version")})
	dec("error-op-0x7f", wire.Response{Op: 0x7f, ID: 222, Status: wire.StatusError, NextMs: unknown, Code: wire.CodeUnknownOp, Message: []byte("unknown op")})
	dec("error-message-1024-bytes", wire.Response{Op: wire.OpCheck, ID: 223, Status: wire.StatusError,
		NextMs: unknown, Code: wire.CodeInternal, Message: bytes.Repeat([]byte("m"), wire.MaxMessageLen)})
	dec("error-message-non-ascii", wire.Response{Op: wire.OpCheck, ID: 224, Status: wire.StatusError,
		NextMs: unknown, Code: wire.CodeMalformed, Message: []byte("ünïcode\n\t\x00\xff")})
	dec("error-with-rule", wire.Response{Op: wire.OpCheck, ID: 225, Status: wire.StatusError,
		Code: wire.CodeCostTooLarge, Limit: 10, WindowMs: 1000, Quota: 10, QuotaWindowMs: 1000, NextMs: unknown,
		Rule: []byte("small"), Message: []byte("cost 11 exceeds the capacity 10")})

	// Broken responses, built from a good one.
	good := wire.AppendResponse(nil, &wire.Response{Op: wire.OpCheck, ID: 300, Status: wire.StatusAllowed,
		Limit: 10, Remaining: 9, ResetMs: 100, WindowMs: 1000, Quota: 10, QuotaWindowMs: 1000, NextMs: 100,
		Rule: []byte("rule"), Code: 0})
	withLength := func(f []byte, n uint32) []byte {
		f = bytes.Clone(f)
		binary.BigEndian.PutUint32(f, n)
		return f
	}
	set := func(f []byte, i int, b byte) []byte {
		f = bytes.Clone(f)
		f[i] = b
		return f
	}
	// body builds a response frame around a raw body, fixing the length.
	raw := func(id uint32, body ...[]byte) []byte {
		f := binary.BigEndian.AppendUint32(nil, 0)
		f = append(f, wire.Version, byte(wire.OpCheck|wire.OpResponse), 0, 0)
		f = binary.BigEndian.AppendUint32(f, id)
		for _, b := range body {
			f = append(f, b...)
		}
		binary.BigEndian.PutUint32(f, uint32(len(f)-4))
		return f
	}
	fixed := func(rl uint8) []byte { // status .. rule length, all zero but the rule length
		return append(make([]byte, 45), rl)
	}
	errMsg := wire.AppendResponse(nil, &wire.Response{Op: wire.OpCheck, ID: 301, Status: wire.StatusError,
		NextMs: unknown, Code: wire.CodeInternal, Message: []byte("abc")})
	decErr("empty", "no bytes at all", []byte{})
	decErr("length-field-only", "4 bytes: the length field alone", good[:4])
	decErr("header-cut", "11 bytes: the header is cut", good[:11])
	decErr("truncated-body", "the frame is one byte shorter than its length field says", good[:len(good)-1])
	decErr("truncated-half", "half of the frame", good[:len(good)/2])
	decErr("bytes-left-over", "one byte after the frame its length field announces", append(bytes.Clone(good), 0))
	decErr("trailing-in-frame", "the length field counts a byte after the message", raw(302, fixed(0), []byte{0, 0, 0, 0, 0}))
	decErr("length-below-8", "length field 7", withLength(good[:12], 7))
	decErr("length-0", "length field 0", withLength(good[:12], 0))
	decErr("length-above-16380", "length field 16381", withLength(good, wire.MaxFrame-3))
	decErr("length-max", "length field 4294967295", withLength(good, math.MaxUint32))
	decErr("bad-version-0", "version byte 0", set(good, 4, 0))
	decErr("bad-version-2", "version byte 2", set(good, 4, 2))
	decErr("op-without-response-bit", "op 0x01: a request op, not a response", set(good, 5, byte(wire.OpCheck)))
	decErr("op-0", "op 0x00", set(good, 5, 0))
	decErr("status-5", "unknown status 5", set(good, 12, 5))
	decErr("status-255", "unknown status 255", set(good, 12, 255))
	decErr("body-empty", "a header with no body", raw(303))
	decErr("body-fixed-part-cut", "the body stops inside its fixed part", raw(304, make([]byte, 49)))
	decErr("body-34-bytes", "a 34-byte body: the fixed part without quota, quota window and next", raw(311, make([]byte, 34)))
	decErr("body-cut-in-quota", "the body stops inside quota", raw(312, make([]byte, 33)))
	decErr("body-cut-in-quota-window", "the body stops inside quota window", raw(313, make([]byte, 39)))
	decErr("body-cut-in-next", "the body stops inside next", raw(314, make([]byte, 43)))
	decErr("body-cut-before-rule-length", "the body stops after next, before the rule length", raw(315, make([]byte, 45)))
	decErr("layout-without-quota", "the worked example's answer laid out without quota, quota window and next (40-byte body)",
		raw(7, []byte{byte(wire.StatusLimited)}, binary.BigEndian.AppendUint64(nil, 30), make([]byte, 8),
			[]byte{0, 0, 0xa0, 0x28, 0, 0, 0x07, 0xd0, 0, 0, 0xea, 0x60, 6}, []byte("search"), make([]byte, 4)))
	decErr("rule-past-end", "rule length 10 with 3 rule bytes", raw(305, fixed(10), []byte("abc"), []byte{0, 0, 0, 0}))
	decErr("rule-255-past-end", "rule length 255 with the frame ending after the rule length", raw(306, fixed(255)))
	decErr("message-over-1024", "message length 1025 with 1025 message bytes",
		raw(307, []byte{byte(wire.StatusError)}, make([]byte, 44), []byte{0, 0, 7, 0x04, 0x01}, bytes.Repeat([]byte("m"), 1025)))
	decErr("message-length-max", "message length 65535", raw(308, fixed(0), []byte{0, 7, 0xff, 0xff}, []byte("abc")))
	decErr("message-past-end", "message length 5 with 3 message bytes", raw(309, fixed(0), []byte{0, 7, 0, 5}, []byte("abc")))
	decErr("message-cut", "an error answer whose last byte is missing", errMsg[:len(errMsg)-1])
	decErr("code-cut", "the body ends inside the error code", raw(310, fixed(0), []byte{0}))
	acquired := wire.AppendResponse(nil, &wire.Response{Op: wire.OpAcquire, ID: 320, Status: wire.StatusAllowed,
		Limit: 2, Remaining: 1, NextMs: unknown, Rule: []byte("exports"), Token: []byte("AgEC")})
	noLease := bytes.Clone(acquired[:len(acquired)-6])
	binary.BigEndian.PutUint32(noLease, uint32(len(noLease)-4))
	decErr("acquire-without-lease", "an ACQUIRE answer that ends after its message, with no lease length", noLease)
	decErr("acquire-lease-cut", "an ACQUIRE answer whose lease is one byte short", acquired[:len(acquired)-1])
	longLease := wire.AppendResponse(nil, &wire.Response{Op: wire.OpAcquire, ID: 321, Status: wire.StatusAllowed,
		NextMs: unknown, Token: bytes.Repeat([]byte("L"), wire.MaxTokenLen)})
	longLease = append(longLease, 'L')
	binary.BigEndian.PutUint16(longLease[len(longLease)-wire.MaxTokenLen-3:], wire.MaxTokenLen+1)
	binary.BigEndian.PutUint32(longLease, uint32(len(longLease)-4))
	decErr("acquire-lease-1025-bytes", "an ACQUIRE answer with a lease of 1025 bytes", longLease)
	released := wire.AppendResponse(nil, &wire.Response{Op: wire.OpRelease, ID: 322, Status: wire.StatusAllowed, NextMs: unknown})
	released = append(released, 0, 0)
	binary.BigEndian.PutUint32(released, uint32(len(released)-4))
	decErr("release-with-lease-length", "a RELEASE answer followed by two bytes: only ACQUIRE answers carry a lease", released)
	return lines
}

// bigDescs returns n descriptors at the name and value limits.
func bigDescs(n int) []wire.Descriptor {
	ds := make([]wire.Descriptor, n)
	for i := range ds {
		name := fmt.Sprintf("%02d", i) + strings.Repeat("n", wire.MaxNameLen-2)
		ds[i] = wire.Descriptor{Name: []byte(name), Value: bytes.Repeat([]byte("v"), wire.MaxValueLen)}
	}
	return ds
}

const corpusHeader = `# rld wire protocol, version 1: golden frames for client test suites.
# Generated and verified by the wire package: go test ./wire -run TestCorpus [-update].
# Format: clients/testdata/README.md. Fields are separated by one TAB; "-" is an empty field.
#
# encode        NAME  ID  OP  COST  DESCS  HEX
# encode_error  NAME  ID  OP  COST  DESCS  WHAT
# encode_lease  NAME  ID  OP  COST  LEASEHEX  HEX
# encode_lease_error  NAME  ID  OP  COST  LEASEHEX  WHAT
# decode        NAME  HEX  ID  OP  FLAGS  STATUS  LIMIT  REMAINING  RESET  RETRY  WINDOW  QUOTA  QUOTAWINDOW  NEXT  RULEHEX  CODE  MSGHEX
# decode_acquire  NAME  HEX  ID  OP  FLAGS  STATUS  LIMIT  REMAINING  RESET  RETRY  WINDOW  QUOTA  QUOTAWINDOW  NEXT  RULEHEX  CODE  MSGHEX  LEASEHEX
# decode_error  NAME  HEX  WHAT
`

// hexOrDash returns b as lowercase hex, or "-" when it is empty.
func hexOrDash(b []byte) string {
	if len(b) == 0 {
		return "-"
	}
	return hex.EncodeToString(b)
}

func formatDescs(ds []wire.Descriptor) string {
	if len(ds) == 0 {
		return "-"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = hex.EncodeToString(d.Name) + ":" + hex.EncodeToString(d.Value)
	}
	return strings.Join(parts, ",")
}

// formatCorpus renders the cases as the corpus file.
func formatCorpus(lines []corpusLine) []byte {
	var b bytes.Buffer
	b.WriteString(corpusHeader)
	prev := ""
	for _, l := range lines {
		if l.kind != prev {
			fmt.Fprintf(&b, "\n# %s\n", l.kind)
			prev = l.kind
		}
		var f []string
		switch l.kind {
		case "encode":
			f = []string{l.name, fmt.Sprint(l.req.ID), fmt.Sprint(uint8(l.req.Op)), fmt.Sprint(l.cost),
				formatDescs(l.req.Descs), hex.EncodeToString(wire.AppendRequest(nil, &l.req))}
		case "encode_error":
			f = []string{l.name, fmt.Sprint(l.req.ID), fmt.Sprint(uint8(l.req.Op)), fmt.Sprint(l.cost),
				formatDescs(l.req.Descs), l.what}
		case "encode_lease":
			f = []string{l.name, fmt.Sprint(l.req.ID), fmt.Sprint(uint8(l.req.Op)), fmt.Sprint(l.cost),
				hexOrDash(l.req.Token), hex.EncodeToString(wire.AppendRequest(nil, &l.req))}
		case "encode_lease_error":
			f = []string{l.name, fmt.Sprint(l.req.ID), fmt.Sprint(uint8(l.req.Op)), fmt.Sprint(l.cost),
				hexOrDash(l.req.Token), l.what}
		case "decode", "decode_acquire":
			r := l.res
			f = []string{l.name, hex.EncodeToString(l.hex), fmt.Sprint(r.ID), fmt.Sprint(uint8(r.Op | wire.OpResponse)),
				fmt.Sprint(r.Flags), fmt.Sprint(uint8(r.Status)), fmt.Sprint(r.Limit), fmt.Sprint(r.Remaining),
				fmt.Sprint(r.ResetMs), fmt.Sprint(r.RetryMs), fmt.Sprint(r.WindowMs), fmt.Sprint(r.Quota),
				fmt.Sprint(r.QuotaWindowMs), fmt.Sprint(r.NextMs), hexOrDash(r.Rule),
				fmt.Sprint(uint16(r.Code)), hexOrDash(r.Message)}
			if l.kind == "decode_acquire" {
				f = append(f, hexOrDash(r.Token))
			}
		case "decode_error":
			f = []string{l.name, hexOrDash(l.hex), l.what}
		}
		b.WriteString(l.kind + "\t" + strings.Join(f, "\t") + "\n")
	}
	return b.Bytes()
}

// parsedLine is one line of the corpus file, split into fields.
type parsedLine struct {
	no     int
	fields []string
}

func readCorpus(t *testing.T) []parsedLine {
	t.Helper()
	f, err := os.Open(corpusPath)
	if err != nil {
		t.Fatalf("open corpus: %v (regenerate with go test ./wire -run TestCorpus -update)", err)
	}
	defer f.Close()
	var out []parsedLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for no := 1; sc.Scan(); no++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, parsedLine{no, strings.Split(line, "\t")})
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("read corpus: %v", err)
	}
	return out
}

// TestCorpus checks every line of the golden corpus against the wire
// package, and that the file holds exactly the cases of corpusCases. With
// -update it rewrites the file first.
func TestCorpus(t *testing.T) {
	want := formatCorpus(corpusCases())
	if *updateCorpus {
		if err := os.WriteFile(corpusPath, want, 0o644); err != nil {
			t.Fatalf("write corpus: %v", err)
		}
	}
	got, err := os.ReadFile(corpusPath)
	if err != nil {
		t.Fatalf("read corpus: %v (regenerate with go test ./wire -run TestCorpus -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the cases in corpus_test.go: run go test ./wire -run TestCorpus -update", corpusPath)
	}

	kinds := map[string]int{}
	statuses := map[wire.Status]bool{}
	codes := map[wire.Code]bool{}
	for _, l := range readCorpus(t) {
		t.Run(fmt.Sprintf("line%d", l.no), func(t *testing.T) {
			if len(l.fields) < 2 {
				t.Fatalf("line %d: %d fields", l.no, len(l.fields))
			}
			kinds[l.fields[0]]++
			switch l.fields[0] {
			case "encode":
				verifyEncode(t, l.fields)
			case "encode_error":
				verifyEncodeError(t, l.fields)
			case "encode_lease":
				verifyEncodeLease(t, l.fields)
			case "encode_lease_error":
				verifyEncodeLeaseError(t, l.fields)
			case "decode", "decode_acquire":
				r := verifyDecode(t, l.fields)
				statuses[r.Status] = true
				codes[r.Code] = true
			case "decode_error":
				verifyDecodeError(t, l.fields)
			default:
				t.Fatalf("line %d: unknown kind %q", l.no, l.fields[0])
			}
		})
	}
	for _, k := range []string{"encode", "encode_error", "encode_lease", "encode_lease_error", "decode", "decode_acquire", "decode_error"} {
		if kinds[k] == 0 {
			t.Errorf("the corpus has no %s line", k)
		}
	}
	for s := wire.StatusAllowed; s <= wire.StatusError; s++ {
		if !statuses[s] {
			t.Errorf("no decode line has status %s", s)
		}
	}
	for c := wire.CodeNone; c <= wire.CodeBadCost; c++ {
		if !codes[c] {
			t.Errorf("no decode line has error code %s", c)
		}
	}
}

func fieldCount(t *testing.T, f []string, n int) {
	t.Helper()
	if len(f) != n {
		t.Fatalf("%s %s: %d fields, want %d", f[0], f[1], len(f), n)
	}
}

func parseUint(t *testing.T, s string, bits int) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, bits)
	if err != nil {
		t.Fatalf("bad number %q: %v", s, err)
	}
	return v
}

func parseHex(t *testing.T, s string) []byte {
	t.Helper()
	if s == "-" {
		return nil
	}
	if s != strings.ToLower(s) {
		t.Fatalf("hex %q is not lowercase", s)
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func parseDescs(t *testing.T, s string) []wire.Descriptor {
	t.Helper()
	if s == "-" {
		return nil
	}
	var ds []wire.Descriptor
	for _, p := range strings.Split(s, ",") {
		name, value, ok := strings.Cut(p, ":")
		if !ok {
			t.Fatalf("descriptor %q has no colon", p)
		}
		ds = append(ds, wire.Descriptor{Name: parseHex(t, name), Value: parseHex(t, value)})
	}
	return ds
}

// parseRequest reads the ID, OP, COST and DESCS fields; cost may exceed
// 32 bits.
func parseRequest(t *testing.T, f []string) (wire.Request, uint64) {
	t.Helper()
	r := wire.Request{
		ID:    uint32(parseUint(t, f[2], 32)),
		Op:    wire.Op(parseUint(t, f[3], 8)),
		Descs: parseDescs(t, f[5]),
	}
	cost := parseUint(t, f[4], 64)
	r.Cost = uint32(cost)
	return r, cost
}

func verifyEncode(t *testing.T, f []string) {
	fieldCount(t, f, 7)
	r, cost := parseRequest(t, f)
	if cost > math.MaxUint32 {
		t.Fatalf("cost %d does not fit in 4 bytes", cost)
	}
	want := parseHex(t, f[6])
	got := wire.AppendRequest(nil, &r)
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendRequest:\n got %x\nwant %x", got, want)
	}
	var back wire.Request
	if err := wire.DecodeRequest(want, &back); err != nil {
		t.Fatalf("the daemon's decoder refuses the frame: %v", err)
	}
	if r.Op == wire.OpPing {
		r.Cost, r.Descs = 0, nil
	}
	equalRequest(t, &r, &back)
}

func verifyEncodeError(t *testing.T, f []string) {
	fieldCount(t, f, 7)
	r, cost := parseRequest(t, f)
	if f[6] == "" || f[6] == "-" {
		t.Fatalf("no description")
	}
	if cost > math.MaxUint32 {
		return // no 4-byte field holds it
	}
	var back wire.Request
	if err := wire.DecodeRequest(wire.AppendRequest(nil, &r), &back); err == nil {
		t.Fatalf("the daemon's decoder accepts this request: it must not be in encode_error")
	}
}

// parseLeaseRequest reads the ID, OP, COST and LEASEHEX fields.
func parseLeaseRequest(t *testing.T, f []string) wire.Request {
	t.Helper()
	return wire.Request{
		ID:    uint32(parseUint(t, f[2], 32)),
		Op:    wire.Op(parseUint(t, f[3], 8)),
		Cost:  uint32(parseUint(t, f[4], 32)),
		Token: parseHex(t, f[5]),
	}
}

func verifyEncodeLease(t *testing.T, f []string) {
	fieldCount(t, f, 7)
	r := parseLeaseRequest(t, f)
	if r.Op != wire.OpRelease && r.Op != wire.OpSettle {
		t.Fatalf("OP %d: encode_lease is for RELEASE and SETTLE", r.Op)
	}
	want := parseHex(t, f[6])
	if got := wire.AppendRequest(nil, &r); !bytes.Equal(got, want) {
		t.Fatalf("AppendRequest:\n got %x\nwant %x", got, want)
	}
	var back wire.Request
	if err := wire.DecodeRequest(want, &back); err != nil {
		t.Fatalf("the daemon's decoder refuses the frame: %v", err)
	}
	equalRequest(t, &r, &back)
}

func verifyEncodeLeaseError(t *testing.T, f []string) {
	fieldCount(t, f, 7)
	r := parseLeaseRequest(t, f)
	var back wire.Request
	if err := wire.DecodeRequest(wire.AppendRequest(nil, &r), &back); err == nil && len(r.Token) <= wire.MaxTokenLen {
		t.Fatalf("the daemon's decoder accepts this request: it must not be in encode_lease_error")
	}
}

func verifyDecode(t *testing.T, f []string) wire.Response {
	n := 18
	if f[0] == "decode_acquire" {
		n = 19
	}
	fieldCount(t, f, n)
	frame := parseHex(t, f[2])
	op := parseUint(t, f[4], 8)
	want := wire.Response{
		ID:            uint32(parseUint(t, f[3], 32)),
		Op:            wire.Op(op) &^ wire.OpResponse,
		Flags:         uint16(parseUint(t, f[5], 16)),
		Status:        wire.Status(parseUint(t, f[6], 8)),
		Limit:         parseUint(t, f[7], 64),
		Remaining:     parseUint(t, f[8], 64),
		ResetMs:       uint32(parseUint(t, f[9], 32)),
		RetryMs:       uint32(parseUint(t, f[10], 32)),
		WindowMs:      uint32(parseUint(t, f[11], 32)),
		Quota:         parseUint(t, f[12], 64),
		QuotaWindowMs: uint32(parseUint(t, f[13], 32)),
		NextMs:        uint32(parseUint(t, f[14], 32)),
		Rule:          parseHex(t, f[15]),
		Code:          wire.Code(parseUint(t, f[16], 16)),
		Message:       parseHex(t, f[17]),
	}
	if n == 19 {
		want.Token = parseHex(t, f[18])
		if want.Op != wire.OpAcquire {
			t.Fatalf("decode_acquire of OP %d", op)
		}
	} else if want.Op == wire.OpAcquire {
		t.Fatalf("an ACQUIRE answer belongs in decode_acquire")
	}
	if op&uint64(wire.OpResponse) == 0 {
		t.Fatalf("OP %d lacks the response bit", op)
	}
	if want.Limit > maxExact || want.Remaining > maxExact || want.Quota > maxExact {
		t.Fatalf("an 8-byte field is above 2^53")
	}
	var got wire.Response
	if err := wire.DecodeResponse(frame, &got); err != nil {
		t.Fatalf("DecodeResponse: %v", err)
	}
	if len(got.Rule) == 0 {
		got.Rule = nil
	}
	if len(got.Message) == 0 {
		got.Message = nil
	}
	if len(got.Token) == 0 {
		got.Token = nil
	}
	equalResponse(t, &want, &got)
	if enc := wire.AppendResponse(nil, &want); !bytes.Equal(enc, frame) {
		t.Fatalf("AppendResponse:\n got %x\nwant %x", enc, frame)
	}
	// The corpus guards its clients: a decoder given this frame with any
	// one byte changed must refuse it or decode a different answer.
	for i := range frame {
		for _, x := range []byte{0x01, 0x80, 0xff} {
			bad := bytes.Clone(frame)
			bad[i] ^= x
			var r wire.Response
			if err := wire.DecodeResponse(bad, &r); err != nil {
				continue
			}
			if r.Op == got.Op && r.Flags == got.Flags && r.ID == got.ID && r.Status == got.Status &&
				r.Limit == got.Limit && r.Remaining == got.Remaining && r.ResetMs == got.ResetMs &&
				r.RetryMs == got.RetryMs && r.WindowMs == got.WindowMs && r.Quota == got.Quota &&
				r.QuotaWindowMs == got.QuotaWindowMs && r.NextMs == got.NextMs && r.Code == got.Code &&
				bytes.Equal(r.Rule, got.Rule) && bytes.Equal(r.Message, got.Message) && bytes.Equal(r.Token, got.Token) {
				t.Fatalf("byte %d ^ %#x decodes to the same answer", i, x)
			}
		}
	}
	return got
}

func verifyDecodeError(t *testing.T, f []string) {
	fieldCount(t, f, 4)
	var r wire.Response
	if err := wire.DecodeResponse(parseHex(t, f[2]), &r); err == nil {
		t.Fatalf("DecodeResponse accepts the frame")
	}
}
