package wire_test

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/rld/rld/wire"
)

// goldenRequestHex and goldenResponseHex are the worked example of
// docs/protocol.md; keep the two in step.
const (
	goldenRequestHex = "00000032" + "01" + "01" + "0000" + "00000007" + // header
		"00000001" + "02" + // cost, count
		"07" + "6170695f6b6579" + "0006" + "736b5f313233" + // api_key=sk_123
		"08" + "656e64706f696e74" + "000a" + "2f76312f736561726368" // endpoint=/v1/search

	goldenResponseHex = "00000040" + "01" + "81" + "0000" + "00000007" + // header
		"01" + // status limited
		"000000000000001e" + // limit 30
		"0000000000000000" + // remaining 0
		"0000a028" + // reset 41000 ms
		"000007d0" + // retry after 2000 ms
		"0000ea60" + // window 60000 ms
		"000000000000001e" + // quota 30
		"0000ea60" + // quota window 60000 ms
		"000007d0" + // next 2000 ms
		"06" + "736561726368" + // rule "search"
		"0000" + // error code none
		"0000" // message length 0

	goldenPingHex     = "00 00 00 08 01 03 00 00 00 00 00 01"
	goldenPongHeadHex = "00 00 00 3a 01 83 00 00 00 00 00 01" // then the body, goldenPongBodyText
	// goldenPongBodyText is how docs/protocol.md spells a PING answer's
	// body: no limit applied, so next is absent.
	goldenPongBodyText = "41 zero bytes, then `ff ff ff ff` (next: absent), then 5 zero bytes"
)

func goldenRequest() wire.Request {
	return wire.Request{Op: wire.OpCheck, ID: 7, Cost: 1, Descs: descs("api_key", "sk_123", "endpoint", "/v1/search")}
}

func goldenResponse() wire.Response {
	return wire.Response{Op: wire.OpCheck, ID: 7, Status: wire.StatusLimited,
		Limit: 30, Remaining: 0, ResetMs: 41000, RetryMs: 2000, WindowMs: 60000,
		Quota: 30, QuotaWindowMs: 60000, NextMs: 2000, Rule: []byte("search")}
}

// descs builds descriptors from name, value pairs.
func descs(kv ...string) []wire.Descriptor {
	ds := make([]wire.Descriptor, 0, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		ds = append(ds, wire.Descriptor{Name: []byte(kv[i]), Value: []byte(kv[i+1])})
	}
	return ds
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex literal: %v", err)
	}
	return b
}

// frame builds a frame by hand: the length field counts the header's last
// 8 bytes plus body.
func frame(version uint8, op wire.Op, flags uint16, id uint32, body ...[]byte) []byte {
	b := make([]byte, wire.HeaderSize, wire.HeaderSize+64)
	b[4], b[5] = version, byte(op)
	binary.BigEndian.PutUint16(b[6:], flags)
	binary.BigEndian.PutUint32(b[8:], id)
	for _, p := range body {
		b = append(b, p...)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

// checkFrame builds a CHECK frame with id 7 from raw body pieces.
func checkFrame(body ...[]byte) []byte { return frame(wire.Version, wire.OpCheck, 0, 7, body...) }

func u8(v uint8) []byte      { return []byte{v} }
func u16(v uint16) []byte    { return binary.BigEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte    { return binary.BigEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte    { return binary.BigEndian.AppendUint64(nil, v) }
func str(s string) []byte    { return []byte(s) }
func rep(n int) []byte       { return bytes.Repeat([]byte{'x'}, n) }
func repS(n int) string      { return string(rep(n)) }
func cat(p ...[]byte) []byte { return bytes.Join(p, nil) }

func equalRequest(t *testing.T, want, got *wire.Request) {
	t.Helper()
	if !bytes.Equal(got.Token, want.Token) {
		t.Fatalf("token: got %q, want %q", got.Token, want.Token)
	}
	if got.Op != want.Op || got.Flags != want.Flags || got.ID != want.ID || got.Cost != want.Cost {
		t.Fatalf("header/cost: got op=%#x flags=%#x id=%d cost=%d, want op=%#x flags=%#x id=%d cost=%d",
			got.Op, got.Flags, got.ID, got.Cost, want.Op, want.Flags, want.ID, want.Cost)
	}
	if len(got.Descs) != len(want.Descs) {
		t.Fatalf("got %d descriptors, want %d", len(got.Descs), len(want.Descs))
	}
	for i := range want.Descs {
		g, w := got.Descs[i], want.Descs[i]
		if !bytes.Equal(g.Name, w.Name) || !bytes.Equal(g.Value, w.Value) {
			t.Fatalf("descriptor %d: got %q=%q, want %q=%q", i, g.Name, g.Value, w.Name, w.Value)
		}
	}
}

func equalResponse(t *testing.T, want, got *wire.Response) {
	t.Helper()
	w, g := want, got
	if g.Op != w.Op || g.Flags != w.Flags || g.ID != w.ID || g.Status != w.Status ||
		g.Limit != w.Limit || g.Remaining != w.Remaining || g.ResetMs != w.ResetMs ||
		g.RetryMs != w.RetryMs || g.WindowMs != w.WindowMs || g.Quota != w.Quota ||
		g.QuotaWindowMs != w.QuotaWindowMs || g.NextMs != w.NextMs || g.Code != w.Code ||
		!bytes.Equal(g.Rule, w.Rule) || !bytes.Equal(g.Message, w.Message) || !bytes.Equal(g.Token, w.Token) {
		t.Fatalf("got %+v, want %+v", *g, *w)
	}
}

// maxFrameDescs returns descriptors that make a CHECK frame of exactly
// MaxFrame bytes: three attributes at the attribute value limit and one
// of 16343 bytes (12 + 5 + 3×16390 + 16349).
func maxFrameDescs() []wire.Descriptor {
	var kv []string
	for i := range 3 {
		kv = append(kv, fmt.Sprintf(":t%d", i), repS(wire.MaxAttrValueLen))
	}
	kv = append(kv, ":t3", repS(16343))
	return descs(kv...)
}

func TestRequestRoundTrip(t *testing.T) {
	var manyKV []string
	for i := range wire.MaxDescriptors {
		manyKV = append(manyKV, fmt.Sprintf("d%d", i), fmt.Sprintf("v%d", i))
	}
	tests := []struct {
		name string
		req  wire.Request
		size int // expected frame size; 0 to skip
	}{
		{"check", goldenRequest(), 54},
		{"peek", wire.Request{Op: wire.OpPeek, ID: 1, Cost: 5, Descs: descs("ip", "10.0.0.1")}, 0},
		{"ping", wire.Request{Op: wire.OpPing, ID: 99}, wire.HeaderSize},
		{"no descriptors", wire.Request{Op: wire.OpCheck, ID: 2, Cost: 1}, wire.HeaderSize + 5},
		{"cost 0", wire.Request{Op: wire.OpCheck, ID: 3, Descs: descs("k", "v")}, 0},
		{"max cost and id", wire.Request{Op: wire.OpCheck, ID: 1<<32 - 1, Cost: 1<<32 - 1, Descs: descs("k", "v")}, 0},
		{"empty value", wire.Request{Op: wire.OpCheck, ID: 4, Cost: 1, Descs: descs("k", "")}, 0},
		{"max descriptors", wire.Request{Op: wire.OpCheck, ID: 5, Cost: 1, Descs: descs(manyKV...)}, 0},
		{"max name and value", wire.Request{Op: wire.OpPeek, ID: 6, Cost: 2,
			Descs: descs(repS(wire.MaxNameLen), repS(wire.MaxValueLen))}, wire.HeaderSize + 5 + 1 + 64 + 2 + 1024},
		{"max frame", wire.Request{Op: wire.OpCheck, ID: 8, Cost: 1, Descs: maxFrameDescs()}, wire.MaxFrame},
		{"acquire", wire.Request{Op: wire.OpAcquire, ID: 9, Cost: 1, Descs: descs("api_key", "k")}, wire.HeaderSize + 5 + 1 + 7 + 2 + 1},
		{"release", wire.Request{Op: wire.OpRelease, ID: 10, Token: []byte("AQEC")}, wire.HeaderSize + 2 + 4},
		{"settle", wire.Request{Op: wire.OpSettle, ID: 12, Cost: 250, Token: []byte("AQEC")}, wire.HeaderSize + 4 + 2 + 4},
		{"release of the longest lease", wire.Request{Op: wire.OpRelease, ID: 11, Token: rep(wire.MaxTokenLen)}, wire.HeaderSize + 2 + wire.MaxTokenLen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("prefix")
			b := wire.AppendRequest(prefix, &tt.req)
			if !bytes.Equal(b[:len(prefix)], prefix) {
				t.Fatalf("AppendRequest overwrote the prefix: %q", b[:len(prefix)])
			}
			f := b[len(prefix):]
			if tt.size != 0 && len(f) != tt.size {
				t.Fatalf("frame is %d bytes, want %d", len(f), tt.size)
			}
			if got, n, err := wire.Next(f); err != nil || n != len(f) || len(got) != len(f) {
				t.Fatalf("Next = (%d bytes, %d, %v), want the whole %d-byte frame", len(got), n, err, len(f))
			}
			// Decode into a request holding stale state from another one.
			got := goldenRequest()
			if err := wire.DecodeRequest(f, &got); err != nil {
				t.Fatalf("DecodeRequest: %v", err)
			}
			equalRequest(t, &tt.req, &got)
			if again := wire.AppendRequest(nil, &got); !bytes.Equal(again, f) {
				t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, f)
			}
		})
	}
}

func TestRequestAboveMaxFrame(t *testing.T) {
	r := wire.Request{Op: wire.OpCheck, ID: 8, Cost: 1, Descs: maxFrameDescs()}
	r.Descs[len(r.Descs)-1].Value = append(r.Descs[len(r.Descs)-1].Value, 'x') // one byte more than MaxFrame
	f := wire.AppendRequest(nil, &r)
	if len(f) != wire.MaxFrame+1 {
		t.Fatalf("frame is %d bytes, want %d", len(f), wire.MaxFrame+1)
	}
	var got wire.Request
	if err := wire.DecodeRequest(f, &got); err != wire.ErrFrameTooLarge {
		t.Fatalf("DecodeRequest = %v, want %v", err, wire.ErrFrameTooLarge)
	}
	if got.ID != 8 {
		t.Fatalf("ID = %d, want 8 (the header is readable)", got.ID)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		res  wire.Response
	}{
		{"golden", goldenResponse()},
		{"allowed", wire.Response{Op: wire.OpCheck, ID: 1, Status: wire.StatusAllowed, Limit: 100, Remaining: 99, ResetMs: 600, WindowMs: 1000,
			Quota: 100, QuotaWindowMs: 1000, NextMs: 10, Rule: []byte("per-key")}},
		{"burst, next unknown", wire.Response{Op: wire.OpCheck, ID: 10, Status: wire.StatusAllowed, Limit: 50, Remaining: 49, ResetMs: 600, WindowMs: 60000,
			Quota: 10, QuotaWindowMs: 60000, NextMs: wire.NextUnknown, Rule: []byte("burst")}},
		{"limited", wire.Response{Op: wire.OpCheck, ID: 2, Status: wire.StatusLimited, Limit: 100, ResetMs: 600, RetryMs: 600, WindowMs: 1000,
			Quota: 99, QuotaWindowMs: 2000, NextMs: 0, Rule: []byte("per-key")}},
		{"blocked", wire.Response{Op: wire.OpCheck, ID: 3, Status: wire.StatusBlocked, Rule: []byte("denylist")}},
		{"allowed degraded", wire.Response{Op: wire.OpPeek, ID: 4, Flags: wire.FlagDegraded, Status: wire.StatusAllowedDegraded, Limit: 10, Remaining: 3, WindowMs: 3_600_000}},
		{"error", wire.Response{Op: wire.OpCheck, ID: 5, Status: wire.StatusError, Code: wire.CodeUnavailable, Message: []byte("redis: connection refused")}},
		{"error on reserved op", wire.Response{Op: wire.OpReset, ID: 6, Status: wire.StatusError, Code: wire.CodeNotSupported, Message: []byte("op reserved")}},
		{"acquire with a lease", wire.Response{Op: wire.OpAcquire, ID: 10, Status: wire.StatusAllowed, Limit: 2, Remaining: 1, Rule: []byte("slots"), Token: []byte("AQEC")}},
		{"acquire without a lease", wire.Response{Op: wire.OpAcquire, ID: 11, Status: wire.StatusLimited, Limit: 2, RetryMs: 30, Rule: []byte("slots")}},
		{"acquire with the longest lease", wire.Response{Op: wire.OpAcquire, ID: 12, Status: wire.StatusAllowed, Token: rep(wire.MaxTokenLen)}},
		{"release", wire.Response{Op: wire.OpRelease, ID: 13, Status: wire.StatusAllowed, Limit: 2, Remaining: 2, Rule: []byte("slots")}},
		{"ping", wire.Response{Op: wire.OpPing, ID: 7}},
		{"unknown flags and code kept", wire.Response{Op: wire.OpCheck, ID: 8, Flags: 0xffff, Status: wire.StatusError, Code: 0xffff}},
		{"max values", wire.Response{Op: 0x7f, ID: 1<<32 - 1, Status: wire.StatusAllowed, Limit: 1<<64 - 1, Remaining: 1<<64 - 1, ResetMs: 1<<32 - 1, RetryMs: 1<<32 - 1, WindowMs: 1<<32 - 1,
			Quota: 1<<64 - 1, QuotaWindowMs: 1<<32 - 1, NextMs: 1<<32 - 1}},
		{"max rule and message", wire.Response{Op: wire.OpCheck, ID: 9, Status: wire.StatusError, Code: wire.CodeInternal,
			Rule: rep(wire.MaxRuleLen), Message: rep(wire.MaxMessageLen)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("prefix")
			b := wire.AppendResponse(prefix, &tt.res)
			if !bytes.Equal(b[:len(prefix)], prefix) {
				t.Fatalf("AppendResponse overwrote the prefix: %q", b[:len(prefix)])
			}
			f := b[len(prefix):]
			want := wire.HeaderSize + 50 + len(tt.res.Rule) + len(tt.res.Message)
			if tt.res.Op == wire.OpAcquire {
				want += 2 + len(tt.res.Token)
			}
			if len(f) != want {
				t.Fatalf("frame is %d bytes, want %d", len(f), want)
			}
			if f[5] != byte(tt.res.Op|wire.OpResponse) {
				t.Fatalf("op byte = %#x, want %#x", f[5], tt.res.Op|wire.OpResponse)
			}
			got := goldenResponse() // stale state must not survive
			if err := wire.DecodeResponse(f, &got); err != nil {
				t.Fatalf("DecodeResponse: %v", err)
			}
			equalResponse(t, &tt.res, &got)
			if again := wire.AppendResponse(nil, &got); !bytes.Equal(again, f) {
				t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, f)
			}
		})
	}
}

func TestEveryStatusRoundTrips(t *testing.T) {
	for s := wire.StatusAllowed; s <= wire.StatusError; s++ {
		res := wire.Response{Op: wire.OpCheck, ID: uint32(s), Status: s}
		var got wire.Response
		if err := wire.DecodeResponse(wire.AppendResponse(nil, &res), &got); err != nil {
			t.Fatalf("status %v: %v", s, err)
		}
		equalResponse(t, &res, &got)
	}
}

func TestAppendResponseCutsRuleAndMessage(t *testing.T) {
	res := wire.Response{Op: wire.OpCheck, ID: 1, Status: wire.StatusError, Code: wire.CodeInternal,
		Rule: rep(wire.MaxRuleLen + 10), Message: rep(wire.MaxMessageLen + 10)}
	var got wire.Response
	if err := wire.DecodeResponse(wire.AppendResponse(nil, &res), &got); err != nil {
		t.Fatalf("DecodeResponse: %v", err)
	}
	if len(got.Rule) != wire.MaxRuleLen || len(got.Message) != wire.MaxMessageLen {
		t.Fatalf("rule %d bytes, message %d bytes; want %d and %d", len(got.Rule), len(got.Message), wire.MaxRuleLen, wire.MaxMessageLen)
	}
}

func TestDecodeAliasesFrame(t *testing.T) {
	f := unhex(t, goldenRequestHex)
	var r wire.Request
	if err := wire.DecodeRequest(f, &r); err != nil {
		t.Fatal(err)
	}
	f[18] = 'A' // first byte of "api_key"
	if string(r.Descs[0].Name) != "Api_key" {
		t.Fatalf("name = %q; want it to alias the frame", r.Descs[0].Name)
	}
	// Appending to a decoded name must not overwrite the frame.
	_ = append(r.Descs[0].Name, '!')
	if f[25] != 0 { // high byte of the value length
		t.Fatalf("append to a descriptor name wrote into the frame")
	}
}

func TestGolden(t *testing.T) {
	wantReq, wantRes := unhex(t, goldenRequestHex), unhex(t, goldenResponseHex)

	req := goldenRequest()
	if got := wire.AppendRequest(nil, &req); !bytes.Equal(got, wantReq) {
		t.Errorf("request:\n got %x\nwant %x", got, wantReq)
	}
	res := goldenResponse()
	if got := wire.AppendResponse(nil, &res); !bytes.Equal(got, wantRes) {
		t.Errorf("response:\n got %x\nwant %x", got, wantRes)
	}

	var gotReq wire.Request
	if err := wire.DecodeRequest(wantReq, &gotReq); err != nil {
		t.Fatal(err)
	}
	equalRequest(t, &req, &gotReq)
	var gotRes wire.Response
	if err := wire.DecodeResponse(wantRes, &gotRes); err != nil {
		t.Fatal(err)
	}
	equalResponse(t, &res, &gotRes)
}

func TestGoldenPing(t *testing.T) {
	ping := wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 1})
	if want := unhex(t, strings.ReplaceAll(goldenPingHex, " ", "")); !bytes.Equal(ping, want) {
		t.Errorf("ping:\n got %x\nwant %x", ping, want)
	}
	pong := wire.AppendResponse(nil, &wire.Response{Op: wire.OpPing, ID: 1, NextMs: wire.NextUnknown})
	want := cat(unhex(t, strings.ReplaceAll(goldenPongHeadHex, " ", "")), make([]byte, 41), u32(wire.NextUnknown), make([]byte, 5))
	if !bytes.Equal(pong, want) {
		t.Errorf("ping response:\n got %x\nwant %x", pong, want)
	}
}

// TestGoldenInDoc checks that docs/protocol.md shows the golden frames.
func TestGoldenInDoc(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatalf("cannot read the protocol doc: %v", err)
	}
	for _, s := range []string{goldenRequestHex, goldenResponseHex, goldenPingHex, goldenPongHeadHex, goldenPongBodyText} {
		if !bytes.Contains(doc, []byte(s)) {
			t.Errorf("docs/protocol.md does not contain %s", s)
		}
	}
}

func TestDecodeRequestErrors(t *testing.T) {
	golden := unhex(t, goldenRequestHex)
	withLength := func(f []byte, length uint32) []byte {
		f = bytes.Clone(f)
		binary.BigEndian.PutUint32(f, length)
		return f
	}
	tests := []struct {
		name  string
		frame []byte
		want  *wire.Error
		id    uint32 // r.ID after the error: the id when the header is readable
	}{
		{"empty", nil, wire.ErrTruncated, 0},
		{"header cut", golden[:wire.HeaderSize-1], wire.ErrTruncated, 0},
		{"length 0", withLength(golden, 0), wire.ErrShortFrame, 7},
		{"length 7", withLength(golden, 7), wire.ErrShortFrame, 7},
		{"length above MaxFrame-4", withLength(golden, wire.MaxFrame-3), wire.ErrFrameTooLarge, 7},
		{"length max u32", withLength(golden, 1<<32-1), wire.ErrFrameTooLarge, 7},
		{"frame cut", golden[:len(golden)-1], wire.ErrTruncated, 7},
		{"bytes past length", append(bytes.Clone(golden), 0), wire.ErrTrailing, 7},
		{"version 0", frame(0, wire.OpPing, 0, 7), wire.ErrBadVersion, 7},
		{"version 2", frame(2, wire.OpCheck, 0, 7, u32(1), u8(0)), wire.ErrBadVersion, 7},
		{"op 0", frame(wire.Version, 0, 0, 7), wire.ErrUnknownOp, 7},
		{"op 0x09", frame(wire.Version, 0x09, 0, 7), wire.ErrUnknownOp, 7},
		{"admin without body", frame(wire.Version, wire.OpAdmin, 0, 7), wire.ErrEmptyAdmin, 7},
		{"admin with a flag", frame(wire.Version, wire.OpAdmin, 1, 7, str("{}")), wire.ErrBadFlags, 7},
		{"op is a response", frame(wire.Version, wire.OpCheck|wire.OpResponse, 0, 7, u32(1), u8(0)), wire.ErrUnknownOp, 7},
		{"op 0xff", frame(wire.Version, 0xff, 0, 7), wire.ErrUnknownOp, 7},
		{"reserved RESET", frame(wire.Version, wire.OpReset, 0, 7, u32(1), u8(0)), wire.ErrNotSupported, 7},
		{"ACQUIRE without a body", frame(wire.Version, wire.OpAcquire, 0, 7), wire.ErrTruncated, 7},
		{"RELEASE without a body", frame(wire.Version, wire.OpRelease, 0, 7), wire.ErrTruncated, 7},
		{"RELEASE of an empty lease", frame(wire.Version, wire.OpRelease, 0, 7, u16(0)), wire.ErrBadToken, 7},
		{"RELEASE of a lease too long", frame(wire.Version, wire.OpRelease, 0, 7, u16(wire.MaxTokenLen+1), rep(wire.MaxTokenLen+1)), wire.ErrBadToken, 7},
		{"RELEASE lease truncated", frame(wire.Version, wire.OpRelease, 0, 7, u16(5), rep(4)), wire.ErrTruncated, 7},
		{"RELEASE trailing", frame(wire.Version, wire.OpRelease, 0, 7, u16(4), rep(5)), wire.ErrTrailing, 7},
		{"SETTLE without a lease", frame(wire.Version, wire.OpSettle, 0, 7, u32(5)), wire.ErrTruncated, 7},
		{"SETTLE cut in its cost", frame(wire.Version, wire.OpSettle, 0, 7, u16(1)), wire.ErrTruncated, 7},
		{"SETTLE of an empty lease", frame(wire.Version, wire.OpSettle, 0, 7, u32(5), u16(0)), wire.ErrBadToken, 7},
		{"SETTLE trailing", frame(wire.Version, wire.OpSettle, 0, 7, u32(5), u16(1), rep(2)), wire.ErrTrailing, 7},
		{"flag 0x0001", frame(wire.Version, wire.OpCheck, wire.FlagDegraded, 7, u32(1), u8(0)), wire.ErrBadFlags, 7},
		{"flag 0x8000", frame(wire.Version, wire.OpPing, 0x8000, 7), wire.ErrBadFlags, 7},
		{"ping with body", frame(wire.Version, wire.OpPing, 0, 7, u8(0)), wire.ErrTrailing, 7},
		{"check without body", checkFrame(), wire.ErrTruncated, 7},
		{"count missing", checkFrame(u32(1)), wire.ErrTruncated, 7},
		{"too many descriptors", checkFrame(u32(1), u8(wire.MaxDescriptors+1)), wire.ErrTooManyDescriptors, 7},
		{"count 255", checkFrame(u32(1), u8(255), rep(100)), wire.ErrTooManyDescriptors, 7},
		{"descriptor missing", checkFrame(u32(1), u8(1)), wire.ErrTruncated, 7},
		{"second descriptor missing", checkFrame(u32(1), u8(2), u8(1), str("k"), u16(1), str("v")), wire.ErrTruncated, 7},
		{"empty name", checkFrame(u32(1), u8(1), u8(0), u16(1), str("v")), wire.ErrNameTooLong, 7},
		{"name too long", checkFrame(u32(1), u8(1), u8(wire.MaxNameLen+1), rep(wire.MaxNameLen+1), u16(0)), wire.ErrNameTooLong, 7},
		{"name cut", checkFrame(u32(1), u8(1), u8(5), str("abc")), wire.ErrTruncated, 7},
		{"value length missing", checkFrame(u32(1), u8(1), u8(1), str("k")), wire.ErrTruncated, 7},
		{"value length cut", checkFrame(u32(1), u8(1), u8(1), str("k"), u8(0)), wire.ErrTruncated, 7},
		{"value too long", checkFrame(u32(1), u8(1), u8(1), str("k"), u16(wire.MaxValueLen+1), rep(wire.MaxValueLen+1)), wire.ErrValueTooLong, 7},
		{"value length max u16", checkFrame(u32(1), u8(1), u8(1), str("k"), u16(0xffff)), wire.ErrValueTooLong, 7},
		{"value cut", checkFrame(u32(1), u8(1), u8(1), str("k"), u16(3), str("ab")), wire.ErrTruncated, 7},
		{"trailing byte", checkFrame(u32(1), u8(1), u8(1), str("k"), u16(1), str("v"), u8(0)), wire.ErrTrailing, 7},
		{"extra descriptor", checkFrame(u32(1), u8(0), u8(1), str("k"), u16(1), str("v")), wire.ErrTrailing, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := wire.Request{Descs: make([]wire.Descriptor, 0, 4)}
			err := wire.DecodeRequest(tt.frame, &r)
			if err != tt.want {
				t.Fatalf("DecodeRequest = %v, want %v", err, tt.want)
			}
			if r.ID != tt.id {
				t.Fatalf("ID = %d, want %d", r.ID, tt.id)
			}
			if allocs := testing.AllocsPerRun(10, func() { _ = wire.DecodeRequest(tt.frame, &r) }); allocs != 0 {
				t.Fatalf("error path allocates %v times", allocs)
			}
		})
	}
}

func TestDecodeResponseErrors(t *testing.T) {
	golden := unhex(t, goldenResponseHex)
	body := func(status wire.Status, rule []byte, code wire.Code, msgLen uint16, rest ...[]byte) []byte {
		return cat(u8(uint8(status)), u64(1), u64(0), u32(2), u32(3), u32(4), u64(5), u32(6), u32(7), u8(uint8(len(rule))), rule, u16(uint16(code)), u16(msgLen), cat(rest...))
	}
	resp := func(b []byte) []byte { return frame(wire.Version, wire.OpCheck|wire.OpResponse, 0, 7, b) }
	ok := body(wire.StatusAllowed, str("r"), 0, 0)
	tests := []struct {
		name  string
		frame []byte
		want  *wire.Error
		id    uint32
	}{
		{"empty", nil, wire.ErrTruncated, 0},
		{"header cut", golden[:5], wire.ErrTruncated, 0},
		{"length field only", golden[:4], wire.ErrTruncated, 0},
		{"frame cut", golden[:len(golden)-1], wire.ErrTruncated, 7},
		{"bytes past length", append(bytes.Clone(golden), 0), wire.ErrTrailing, 7},
		{"bad version", frame(2, wire.OpCheck|wire.OpResponse, 0, 7, ok), wire.ErrBadVersion, 7},
		{"request frame", unhex(t, goldenRequestHex), wire.ErrNotResponse, 7},
		{"empty body", resp(nil), wire.ErrTruncated, 7},
		{"fixed part cut", resp(ok[:49]), wire.ErrTruncated, 7},
		{"34-byte body: no quota, quota window or next", resp(ok[:34]), wire.ErrTruncated, 7},
		{"cut inside quota", resp(ok[:33]), wire.ErrTruncated, 7},
		{"cut inside next", resp(ok[:43]), wire.ErrTruncated, 7},
		{"status 5", resp(body(wire.StatusError+1, nil, 0, 0)), wire.ErrBadStatus, 7},
		{"status 255", resp(body(255, nil, 0, 0)), wire.ErrBadStatus, 7},
		{"rule cut", resp(cat(ok[:45], u8(10), str("abc"), u16(0), u16(0))), wire.ErrTruncated, 7},
		{"message too long", resp(body(wire.StatusError, nil, wire.CodeInternal, wire.MaxMessageLen+1, rep(wire.MaxMessageLen+1))), wire.ErrMessageTooLong, 7},
		{"message cut", resp(body(wire.StatusError, nil, wire.CodeInternal, 5, str("abc"))), wire.ErrTruncated, 7},
		{"trailing byte", resp(body(wire.StatusError, nil, wire.CodeInternal, 3, str("abcd"))), wire.ErrTrailing, 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r wire.Response
			if err := wire.DecodeResponse(tt.frame, &r); err != tt.want {
				t.Fatalf("DecodeResponse = %v, want %v", err, tt.want)
			}
			if r.ID != tt.id {
				t.Fatalf("ID = %d, want %d", r.ID, tt.id)
			}
		})
	}
	// A frame whose length field is below 8 or above the limit.
	for _, length := range []uint32{0, 7, wire.MaxFrame - 3} {
		f := bytes.Clone(golden)
		binary.BigEndian.PutUint32(f, length)
		var r wire.Response
		want := wire.ErrShortFrame
		if length > 8 {
			want = wire.ErrFrameTooLarge
		}
		if err := wire.DecodeResponse(f, &r); err != want {
			t.Errorf("length %d: DecodeResponse = %v, want %v", length, err, want)
		}
	}
}

func TestParseHeader(t *testing.T) {
	h, err := wire.ParseHeader(unhex(t, goldenResponseHex))
	if err != nil {
		t.Fatal(err)
	}
	want := wire.Header{Length: 64, Version: wire.Version, Op: wire.OpCheck | wire.OpResponse, ID: 7}
	if h != want {
		t.Fatalf("ParseHeader = %+v, want %+v", h, want)
	}
	// Only the length field is checked.
	h, err = wire.ParseHeader(frame(9, 0xee, 0xabcd, 3))
	if err != nil || h.Version != 9 || h.Op != 0xee || h.Flags != 0xabcd || h.ID != 3 {
		t.Fatalf("ParseHeader = %+v, %v", h, err)
	}
	if _, err := wire.ParseHeader(make([]byte, wire.HeaderSize-1)); err != wire.ErrTruncated {
		t.Fatalf("short input: %v, want %v", err, wire.ErrTruncated)
	}
}

func TestNext(t *testing.T) {
	req := unhex(t, goldenRequestHex)
	res := unhex(t, goldenResponseHex)
	ping := wire.AppendRequest(nil, &wire.Request{Op: wire.OpPing, ID: 1})

	t.Run("partial frame", func(t *testing.T) {
		for i := range len(req) {
			f, n, err := wire.Next(req[:i])
			if f != nil || n != 0 || err != nil {
				t.Fatalf("Next(%d of %d bytes) = (%x, %d, %v), want (nil, 0, nil)", i, len(req), f, n, err)
			}
		}
	})

	t.Run("back to back", func(t *testing.T) {
		want := [][]byte{req, ping, res, req}
		stream := cat(cat(want...), req[:10]) // ends in a partial frame
		var got [][]byte
		for b := stream; ; {
			f, n, err := wire.Next(b)
			if err != nil {
				t.Fatal(err)
			}
			if f == nil {
				if !bytes.Equal(b, req[:10]) {
					t.Fatalf("left %x, want the partial frame", b)
				}
				break
			}
			if n != len(f) || &f[0] != &b[0] {
				t.Fatalf("Next returned n=%d for a %d-byte frame, or a copy", n, len(f))
			}
			got = append(got, f)
			b = b[n:]
		}
		if len(got) != len(want) {
			t.Fatalf("got %d frames, want %d", len(got), len(want))
		}
		for i := range want {
			if !bytes.Equal(got[i], want[i]) {
				t.Fatalf("frame %d: got %x, want %x", i, got[i], want[i])
			}
		}
	})

	t.Run("length checked from 4 bytes", func(t *testing.T) {
		tests := []struct {
			length uint32
			want   error
		}{
			{0, wire.ErrShortFrame},
			{7, wire.ErrShortFrame},
			{8, nil},
			{wire.MaxFrame - 4, nil},
			{wire.MaxFrame - 3, wire.ErrFrameTooLarge},
			{1 << 31, wire.ErrFrameTooLarge},
			{1<<32 - 1, wire.ErrFrameTooLarge},
		}
		for _, tt := range tests {
			// Only the length field: no body is there yet, so the
			// decision cannot depend on (or wait for) one.
			f, n, err := wire.Next(u32(tt.length))
			if f != nil || n != 0 || err != tt.want {
				t.Errorf("Next(length %d) = (%x, %d, %v), want (nil, 0, %v)", tt.length, f, n, err, tt.want)
			}
		}
	})

	t.Run("smallest frame", func(t *testing.T) {
		f, n, err := wire.Next(cat(ping, str("rest")))
		if err != nil || n != wire.HeaderSize || !bytes.Equal(f, ping) {
			t.Fatalf("Next = (%x, %d, %v)", f, n, err)
		}
	})
}

func TestCodes(t *testing.T) {
	names := map[wire.Code]string{}
	for c := wire.CodeNone; c <= wire.CodeBadCost; c++ {
		s := c.String()
		if strings.HasPrefix(s, "code(") {
			t.Errorf("code %d has no name", c)
		}
		if prev, dup := names[c]; dup {
			t.Errorf("codes %d and %s share the name %q", c, prev, s)
		}
		names[c] = s
	}
	if got := wire.Code(200).String(); got != "code(200)" {
		t.Errorf("Code(200).String() = %q", got)
	}
	if got := wire.Status(9).String(); got != "status(9)" {
		t.Errorf("Status(9).String() = %q", got)
	}
	if got := wire.StatusAllowedDegraded.String(); got != "allowed-degraded" {
		t.Errorf("StatusAllowedDegraded.String() = %q", got)
	}
	for s, want := range map[wire.Status]bool{wire.StatusAllowed: true, wire.StatusAllowedDegraded: true,
		wire.StatusLimited: false, wire.StatusBlocked: false, wire.StatusError: false} {
		if s.Allowed() != want {
			t.Errorf("%v.Allowed() = %v", s, !want)
		}
	}
	for op := range wire.Op(0xff) {
		want := op == wire.OpReset
		if op.IsReserved() != want {
			t.Errorf("Op(%#x).IsReserved() = %v", op, !want)
		}
	}
}

func TestCodeOf(t *testing.T) {
	tests := []struct {
		err  error
		want wire.Code
	}{
		{wire.ErrShortFrame, wire.CodeMalformed},
		{wire.ErrFrameTooLarge, wire.CodeFrameTooLarge},
		{wire.ErrBadVersion, wire.CodeBadVersion},
		{wire.ErrTooManyDescriptors, wire.CodeTooLarge},
		{wire.ErrNotSupported, wire.CodeNotSupported},
		{wire.ErrBadFlags, wire.CodeBadFlags},
		{fmt.Errorf("conn 3: %w", wire.ErrUnknownOp), wire.CodeUnknownOp},
		{io.EOF, wire.CodeInternal},
	}
	for _, tt := range tests {
		if got := wire.CodeOf(tt.err); got != tt.want {
			t.Errorf("CodeOf(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
	if !errors.Is(fmt.Errorf("x: %w", wire.ErrTrailing), wire.ErrTrailing) {
		t.Error("errors.Is does not see a wrapped sentinel")
	}
	if got := wire.ErrBadFlags.Error(); got != "wire: bad_flags: unknown flag bits" {
		t.Errorf("Error() = %q", got)
	}
}

func TestNoAllocs(t *testing.T) {
	req := goldenRequest()
	res := goldenResponse()
	reqFrame := wire.AppendRequest(nil, &req)
	resFrame := wire.AppendResponse(nil, &res)
	buf := make([]byte, 0, 256)
	dr := wire.Request{Descs: make([]wire.Descriptor, 0, wire.MaxDescriptors)}
	var ds wire.Response

	check := func(name string, f func()) {
		t.Helper()
		if allocs := testing.AllocsPerRun(100, f); allocs != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, allocs)
		}
	}
	check("AppendRequest", func() { buf = wire.AppendRequest(buf[:0], &req) })
	check("DecodeRequest", func() {
		if err := wire.DecodeRequest(reqFrame, &dr); err != nil {
			t.Fatal(err)
		}
	})
	check("AppendResponse", func() { buf = wire.AppendResponse(buf[:0], &res) })
	check("DecodeResponse", func() {
		if err := wire.DecodeResponse(resFrame, &ds); err != nil {
			t.Fatal(err)
		}
	})
	check("Next", func() { _, _, _ = wire.Next(reqFrame) })
}
